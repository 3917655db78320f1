"""DVC stage ``train_teachers``: local teachers + the global model per KNOT task, their transfer-set predictions (table 1)."""
from otfed.stage import run_stage


def _flow(params):
    from flows.train_teachers import train_teachers_flow_factory

    return train_teachers_flow_factory(params)


if __name__ == "__main__":
    raise SystemExit(run_stage(_flow))
