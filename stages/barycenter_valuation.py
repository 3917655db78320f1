"""DVC stage ``barycenter_valuation``: FedBary client contributions (fig. 4), outlier histogram, detection (fig. 5)."""
from otfed.stage import run_stage


def _flow(params):
    from flows.barycenter_valuation import barycenter_valuation_flow_factory

    return barycenter_valuation_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
