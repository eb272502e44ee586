"""--busy-poll-us: after a frame a network worker polls instead of sleeping,
for that long and no longer, so a busy client's next frame finds it awake
and an idle server costs no CPU."""
import os
import time

import pytest

from support.util import cpu_seconds, run_gdrkv

# They measure the CPU a server spends: beside the parallel tests' load
# the polling worker gets too little of it to show.
pytestmark = pytest.mark.alone


@pytest.mark.parametrize("busy_poll_us, low, high", [
    # one worker polling for 0.3 s of the 1.5 s watched
    (300000, 0.1, 0.7),
    (0, 0, 0.1),
])
def test_a_worker_polls_for_busy_poll_us_after_a_frame_then_sleeps(
        server_factory, make_client, busy_poll_us, low, high):
    server = server_factory("32MiB", args=["--workers", "1", "--busy-poll-us", str(busy_poll_us)])
    assert server.stats()["busy_poll_us"] == busy_poll_us
    client = make_client(server.url)
    client.put("k", b"v" * 4096)
    assert client.get("k") == b"v" * 4096
    before = cpu_seconds(server.proc.pid)
    time.sleep(1.5)
    spent = cpu_seconds(server.proc.pid) - before
    assert low <= spent <= high, f"{spent:.2f} s of CPU in 1.5 s after the last frame"
    # and it still answers, awake or not
    assert client.get("k") == b"v" * 4096


def test_no_polling_after_a_staged_put(server_factory, make_client):
    """That client fills its staging again before its next frame, and the
    CPUs are better left to the copies."""
    server = server_factory("32MiB", args=["--workers", "1", "--busy-poll-us", "300000"])
    client = make_client(server.url, transport="shm")
    client.put("k", b"v" * 4096)
    before = cpu_seconds(server.proc.pid)
    time.sleep(1.0)
    spent = cpu_seconds(server.proc.pid) - before
    assert spent <= 0.1, f"{spent:.2f} s of CPU in 1 s after a staged PUT"
    assert server.stats()["shm_staged_puts"] == 1


def test_auto_polls_only_on_hosts_of_8_cpus_or_more(server_factory):
    server = server_factory("32MiB")
    want = 1000 if os.sysconf("SC_NPROCESSORS_ONLN") >= 8 else 0
    assert server.stats()["busy_poll_us"] == want


@pytest.mark.parametrize("value, mentions", [
    ("soon", "must be a number of microseconds or auto"),
    ("-5", "busy_poll_us must be at least 0"),
    ("2000000", "busy_poll_us must be -1 (auto) or 0 to 1000000"),
])
def test_bad_values_are_refused_by_name(value, mentions):
    out = run_gdrkv("serve", "--no-pretouch", "--listen", "127.0.0.1:0", "--memory", "16MiB",
                    "--busy-poll-us", value, timeout=30)
    assert out.returncode != 0 and mentions in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
