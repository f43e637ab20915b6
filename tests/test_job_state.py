from pathlib import Path

from runtime.config import CONFIG_DIR
from runtime.store.database import Store
from runtime.store.fact_kinds import FactKinds
from runtime.store.job_state import get_state, set_state
from runtime.time.clock import ManualClock

KINDS = FactKinds.load(CONFIG_DIR / "fact_kinds.toml")


def test_state_survives_a_reopen_and_is_per_job(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db", KINDS, clock=ManualClock(10.0)) as store:
        assert get_state(store, "consolidate", "chat", default={"upto": 0}) == {"upto": 0}
        set_state(store, "consolidate", "chat", {"upto": 41})
        set_state(store, "consolidate", "chat", {"upto": 42})
        set_state(store, "facts", "chat", [1, 2])
    with Store(tmp_path / "s.db", KINDS) as store:
        assert get_state(store, "consolidate", "chat") == {"upto": 42}
        assert get_state(store, "facts", "chat") == [1, 2]
        assert get_state(store, "decay", "chat") is None


def test_state_rolls_back_with_the_callers_transaction(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db", KINDS) as store:
        set_state(store, "facts", "upto", 1)
        try:
            with store.write_transaction():
                set_state(store, "facts", "upto", 2)
                raise RuntimeError("crash mid-batch")
        except RuntimeError:
            pass
        assert get_state(store, "facts", "upto") == 1
