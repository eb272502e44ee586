"""`gdrkv stat --nic`: the NIC's hardware counters from a fake sysfs tree
next to a real `gdrkv serve` process's own counters, and per-second rates
with --interval."""
import json

import pytest

from support import fake_sysfs
from support.util import run_gdrkv, stat
from gdrkv.doctor import nic as stat_nic
from gdrkv.cli import main
from gdrkv.sizes import format_size


def gdrkv(*args, env=None, timeout=60):
    return run_gdrkv(*args, env=env, timeout=timeout, drop=("GDRKV_SYSFS_ROOT",))


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = fake_sysfs.build(tmp_path / "root")
    monkeypatch.setenv("GDRKV_SYSFS_ROOT", root)
    return root


def row(text, name):
    """The cells of the table row whose first cell is name."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == name:
            return cells[1:]
    raise AssertionError(f"no row {name!r} in:\n{text}")


def test_stat_nic_shows_both_counter_sets(tree, server_factory):
    server = server_factory(memory="16MiB")
    pool = stat(server.stats(), "pool_bytes")
    result = gdrkv("stat", "--nic", server.url, env={"GDRKV_SYSFS_ROOT": tree})
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    nic, _, servers = out.partition("gdrkv servers")
    assert row(nic, "counter") == ["mlx5_0/1", "mlx5_1/1"]
    words = fake_sysfs.COUNTERS
    # port_*_data counts 4-byte words: 1<<28 words are 1GiB.
    assert row(nic, "port_xmit_bytes") == [format_size(4 * words["mlx5_0"]["port_xmit_data"]),
                                           format_size(4 * words["mlx5_1"]["port_xmit_data"])]
    assert row(nic, "port_xmit_bytes")[0] == "1GiB"
    assert row(nic, "port_rcv_packets") == ["1000", "777777"]
    assert row(nic, "rx_read_requests") == ["1234", "91011"]
    # A hw counter only one port has.
    assert row(nic, "np_cnp_sent") == ["-", "14"]
    assert row(servers, "counter") == [server.address]
    assert row(servers, "pool_bytes") == [str(pool)]


def test_stat_nic_json(tree, server_factory):
    server = server_factory(memory="16MiB")
    result = gdrkv("stat", "--nic", "--json", server.url, env={"GDRKV_SYSFS_ROOT": tree})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    port = report["nic"]["mlx5_1/1"]
    assert port["xmit_bytes"] == 4 * fake_sysfs.COUNTERS["mlx5_1"]["port_xmit_data"]
    assert port["hw_counters"]["rx_write_requests"] == 1213
    assert report["servers"][server.address]["pool_bytes"] == stat(server.stats(), "pool_bytes")


def test_stat_nic_without_a_server_or_rdma(tmp_path):
    alone = gdrkv("stat", "--nic", env={"GDRKV_SYSFS_ROOT": fake_sysfs.build(tmp_path / "t")})
    assert alone.returncode == 0, alone.stderr
    assert "mlx5_1/1" in alone.stdout and "gdrkv servers" not in alone.stdout
    empty = gdrkv("stat", "--nic", env={"GDRKV_SYSFS_ROOT": str(tmp_path / "empty")})
    assert empty.returncode == 0, empty.stderr
    assert "no RDMA devices: /sys/class/infiniband is empty or missing" in empty.stdout


@pytest.mark.parametrize("args, mentions", [
    (["--interval", "1", "gdrkv://127.0.0.1:1"], "--interval needs --nic"),
    (["--nic", "--interval", "-1"], "must not be negative"),
    ([], "server URL"),
])
def test_stat_refuses_bad_combinations(args, mentions):
    result = gdrkv("stat", *args)
    assert result.returncode != 0 and mentions in result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


class SteppedTime:
    """Replaces stat_nic's clock and sleep: sleeping advances the clock and
    runs `between` (the test's changes to the counters)."""

    def __init__(self, between):
        self.now, self.between, self.slept = 1000.0, between, []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds
        self.between()


def test_stat_nic_interval_rates(tree, server_factory, make_client, monkeypatch, capsys):
    server = server_factory(memory="16MiB")
    client = make_client(server.url, transport="tcp")
    words = fake_sysfs.COUNTERS["mlx5_1"]

    def traffic():
        # 2 s of: 8 MiB sent (in 4-byte words), 1000 READs and 10 WRITEs
        # arriving; mlx5_0's counters reset; 1 MiB put through the server.
        fake_sysfs.set_counters(tree, "mlx5_1",
                                {"port_xmit_data": words["port_xmit_data"] + (2 << 20)},
                                {"rx_read_requests": 91011 + 1000, "rx_write_requests": 1213 + 10})
        fake_sysfs.set_counters(tree, "mlx5_0", {"port_xmit_packets": 0})
        client.put("k", b"x" * (1 << 20))

    stepped = SteppedTime(traffic)
    monkeypatch.setattr(stat_nic, "_clock", stepped.clock)
    monkeypatch.setattr(stat_nic, "_sleep", stepped.sleep)
    assert main(["stat", "--nic", "--interval", "2", "--json", server.url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert stepped.slept == [2.0] and report["seconds"] == 2.0
    rates = report["nic_per_second"]["mlx5_1/1"]
    assert rates["port_xmit_bytes"] == 4 * (2 << 20) / 2
    assert rates["rx_read_requests"] == 500 and rates["rx_write_requests"] == 5
    assert rates["port_rcv_bytes"] == 0
    assert report["nic_per_second"]["mlx5_0/1"]["port_xmit_packets"] is None     # reset
    server_rates = report["servers_per_second"][server.address]
    assert server_rates["bytes_in"] >= (1 << 20) / 2, server_rates
    assert "pool_bytes" not in server_rates and "pool_used_bytes" not in server_rates

    stepped = SteppedTime(traffic)
    monkeypatch.setattr(stat_nic, "_clock", stepped.clock)
    monkeypatch.setattr(stat_nic, "_sleep", stepped.sleep)
    fake_sysfs.set_counters(tree, "mlx5_1", words, fake_sysfs.HW_COUNTERS["mlx5_1"])
    fake_sysfs.set_counters(tree, "mlx5_0", fake_sysfs.COUNTERS["mlx5_0"])
    assert main(["stat", "--nic", "--interval", "2", server.url]) == 0
    out = capsys.readouterr().out
    nic, _, servers = out.partition("gdrkv servers")
    assert "per second over 2.00s" in nic
    assert row(nic, "port_xmit_bytes") == ["0B/s", "4MiB/s"]      # 8 MiB in 2 s
    assert row(nic, "rx_read_requests") == ["0/s", "500/s"]
    assert row(nic, "port_xmit_packets") == ["reset", "0/s"]
    # Levels stay levels; running totals become rates.
    assert row(servers, "pool_bytes") == [str(stat(server.stats(), "pool_bytes"))]
    assert row(servers, "puts")[0].endswith("/s")
