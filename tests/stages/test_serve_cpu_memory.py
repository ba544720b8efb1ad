"""serve: on CPU, --gpu-memory-utilization is sized from MemAvailable and the model (vLLM's
default 0.92 of all RAM refuses to start on a machine in use)."""

import pytest

from stages import serve
from stages.backends import BackendUnavailable

GiB = 1 << 30


def test_the_share_asks_for_the_model_and_a_kv_cache_within_what_is_free():
    share, reason = serve.cpu_memory_share(32 * GiB, 20 * GiB, 3 * GiB)
    assert share * 32 * GiB <= 0.8 * 20 * GiB
    assert share * 32 * GiB >= 3 * GiB * serve.CPU_OVERHEAD + serve.CPU_KV_TARGET - 0.05 * GiB
    assert f"--gpu-memory-utilization {share}" in reason and "\n" not in reason


def test_a_busy_machine_gets_less_kv_cache_never_more_than_it_has():
    share, _ = serve.cpu_memory_share(32 * GiB, 6 * GiB, 3 * GiB)
    assert 3 * GiB * serve.CPU_OVERHEAD < share * 32 * GiB <= 0.8 * 6 * GiB


def test_a_model_that_cannot_fit_is_unavailable_saying_how_to_size_it():
    with pytest.raises(BackendUnavailable, match="--gpu-memory-utilization"):
        serve.cpu_memory_share(32 * GiB, 3 * GiB, 3 * GiB)


def test_nothing_is_added_where_the_user_sized_the_engine(monkeypatch):
    monkeypatch.setattr(serve, "sleep_supported", lambda: False)
    monkeypatch.setattr(serve, "meminfo", lambda: (32 * GiB, 20 * GiB))
    assert serve.cpu_memory_args("m", ["--gpu-memory-utilization=0.5"], {}) == ([], None)
    assert serve.cpu_memory_args("m", ["--kv-cache-memory-bytes", "1000"], {}) == ([], None)
    assert serve.cpu_memory_args("m", [], {"VLLM_CPU_KVCACHE_SPACE": "1"}) == ([], None)
    args, reason = serve.cpu_memory_args("m", [], {})
    assert args[0] == "--gpu-memory-utilization" and 0 < float(args[1]) < 0.92 and reason
    monkeypatch.setattr(serve, "sleep_supported", lambda: True)
    assert serve.cpu_memory_args("m", [], {}) == ([], None)
