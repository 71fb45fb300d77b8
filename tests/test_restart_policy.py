import random

from agentos.restart_policy import RestartPolicy, is_crash_loop, next_failure_count, restart_delay


def test_exponential_capped_with_jitter():
    p = RestartPolicy(base_secs=0.1, cap_secs=2.0, multiplier=2.0, jitter=0.0)
    assert [restart_delay(p, n) for n in (1, 2, 3, 4, 5, 6, 10)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    jittery = RestartPolicy(base_secs=1.0, jitter=0.2)
    rng = random.Random(1)
    delays = [restart_delay(jittery, 1, rng) for _ in range(200)]
    assert all(0.8 <= d <= 1.2 for d in delays) and len(set(delays)) > 100


def test_a_stable_run_resets_the_backoff():
    p = RestartPolicy(stable_secs=30)
    assert next_failure_count(p, 4, ran_secs=1.0) == 5
    assert next_failure_count(p, 4, ran_secs=31.0) == 1


def test_crash_loop_window():
    p = RestartPolicy(loop_restarts=3, loop_window_secs=10)
    assert not is_crash_loop(p, [1.0, 2.0], now=3.0)
    assert is_crash_loop(p, [1.0, 2.0, 3.0], now=3.0)
    assert not is_crash_loop(p, [1.0, 2.0, 3.0], now=12.5)
