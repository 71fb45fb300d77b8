import pytest

from agentos import config


def test_defaults_match_the_design():
    c = config.load(None, environ={})
    assert c.gateway.listen == "127.0.0.1:8080"
    assert c.gateway.max_body_bytes == 1 << 20
    assert (c.kernel.actors, c.kernel.max_in_flight_turns, c.kernel.concurrency_limit) == (0, 0, 64)
    assert (c.kernel.session_ttl_secs, c.kernel.drain_secs) == (300, 30)
    assert (c.provider.base_url, c.provider.model, c.provider.api_key_env) == ("", "mock", "OPENAI_API_KEY")
    assert (c.storage.dir, c.storage.durability, c.storage.jsonl_dir) == ("./data", "local", "")
    assert c.auth.api_keys == {}


def test_yaml_then_env_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kernel:\n  max_in_flight_turns: 8\n  concurrency_limit: 3\nstorage:\n  s3:\n    bucket: b1\n")
    c = config.load(path, environ={"AGENTOS_KERNEL_CONCURRENCY_LIMIT": "5", "AGENTOS_GATEWAY_LISTEN": "127.0.0.1:9",
                                   "AGENTOS_STORAGE_S3_PREFIX": "p/", "AGENTOS_AUTH_API_KEYS": "{k1: acme}",
                                   "UNRELATED": "x"})
    assert c.kernel.max_in_flight_turns == 8
    assert c.kernel.concurrency_limit == 5
    assert c.gateway.listen == "127.0.0.1:9"
    assert (c.storage.s3.bucket, c.storage.s3.prefix) == ("b1", "p/")
    assert c.auth.api_keys == {"k1": "acme"}


@pytest.mark.parametrize("text,key", [
    ("kernel:\n  max_inflight: 3\n", "kernel.max_inflight"),
    ("kernal:\n  actors: 1\n", "kernal"),
    ("kernel:\n  concurrency_limit: lots\n", "kernel.concurrency_limit"),
    ("kernel:\n  concurrency_limit: 0\n", "kernel.concurrency_limit"),
    ("storage:\n  durability: maybe\n", "storage.durability"),
    ("gateway:\n  listen: nowhere\n", "gateway.listen"),
    ("gateway:\n  poll_after_answer_usecs: -1\n", "gateway.poll_after_answer_usecs"),
    ("storage:\n  s3: 3\n", "storage.s3"),
    ("storage:\n  max_checkpoint_bytes: 100000000\n", "storage.max_checkpoint_bytes"),   # over a log record
    ("storage:\n  min_free_bytes: -2\n", "storage.min_free_bytes"),
])
def test_bad_keys_and_values_name_the_key(tmp_path, text, key):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as err:
        config.load(path, environ={})
    assert key in str(err.value)


def test_unknown_env_override_is_an_error():
    with pytest.raises(config.ConfigError) as err:
        config.load(None, environ={"AGENTOS_KERNEL_ACTROS": "2"})
    assert "AGENTOS_KERNEL_ACTROS" in str(err.value)


def test_bad_env_value_names_key_and_variable():
    with pytest.raises(config.ConfigError) as err:
        config.load(None, environ={"AGENTOS_KERNEL_ACTORS": "two"})
    assert "kernel.actors" in str(err.value) and "AGENTOS_KERNEL_ACTORS" in str(err.value)


def test_s3_durability_needs_a_bucket():
    with pytest.raises(config.ConfigError, match="storage.s3.bucket"):
        config.load(None, environ={"AGENTOS_STORAGE_DURABILITY": "s3"})


def test_serve_exits_non_zero_naming_the_bad_key(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "c.yaml"
    path.write_text("kernel:\n  concurrency_limt: 3\n")
    proc = subprocess.run([sys.executable, "-m", "agentos.cli", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "kernel.concurrency_limt" in proc.stderr
