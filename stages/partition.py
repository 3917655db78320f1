"""DVC stage ``partition``: data/raw → data/partitions/<federation>.npz + manifest.json (+ reports/partition)."""
from otfed.stage import run_stage


def _flow(params):
    from flows.partition import partition_flow_factory

    return partition_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
