"""DVC stage ``distill``: students with eq. 3 for {Sinkhorn, Entropy} × {A, D, U, E} (KNOT tables 2–4)."""
from otfed.stage import run_stage


def _flow(params):
    from flows.distill import distill_flow_factory

    return distill_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
