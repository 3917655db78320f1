"""DVC stage ``noisy_removal``: clients remove the data FedBary flags; FedAvg before vs after (table 4)."""
from otfed.stage import run_stage


def _flow(params):
    from flows.noisy_removal import noisy_removal_flow_factory

    return noisy_removal_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
