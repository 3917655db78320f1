"""DVC stage ``estimate_bias``: each teacher's probability bias B_k on random texts (KNOT app. D.1)."""
from otfed.stage import run_stage


def _flow(params):
    from flows.estimate_bias import estimate_bias_flow_factory

    return estimate_bias_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
