"""DVC stage ``fed_distance``: FedWaD toy study, federated OTDD between datasets, client clustering."""
from otfed.stage import run_stage


def _flow(params):
    from flows.fed_distance import fed_distance_flow_factory

    return fed_distance_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
