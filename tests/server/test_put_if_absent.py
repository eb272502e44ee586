"""Objects are immutable: a second PUT of a key succeeds without rewriting
(engines re-send the same pages all the time)."""
import pytest

from support.content import batch_get_bytes, batch_put_bytes, content
from support.util import stat
from gdrkv import errors

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "64MiB"


def test_second_put_keeps_first_bytes(server, client):
    first, second = content("first", 200_000), content("second", 200_000)
    dedup_before = stat(server.stats(), "put_dedup")
    assert batch_put_bytes(client, ["page"], [first]) == [0]
    assert batch_put_bytes(client, ["page"], [second]) == [0]
    assert batch_get_bytes(client, ["page"], [200_000]) == ([200_000], [first])
    assert stat(server.stats(), "put_dedup") == dedup_before + 1


def test_second_put_of_another_size_keeps_first_object(client):
    assert batch_put_bytes(client, ["resized"], [content("a", 5000)]) == [0]
    assert batch_put_bytes(client, ["resized"], [content("b", 9000)]) == [0]
    assert client.batch_sizes(["resized"]) == [5000]
    assert client.get("resized") == content("a", 5000)


def test_same_key_twice_in_one_batch_stores_one_whole_value(client):
    # Small values travel in one frame: the server sees the duplicate inside
    # the frame and both entries report success.
    small_a, small_b = content("twice-a", 3000), content("twice-b", 3000)
    assert batch_put_bytes(client, ["twice-small", "twice-small"], [small_a, small_b]) == [0, 0]
    assert client.get("twice-small") in (small_a, small_b)
    # Large ones are striped over two connections: the copy that loses the
    # race may see the other still being written (BUSY), never a mix.
    a, b = content("twice-a", 300_000), content("twice-b", 300_000)
    results = batch_put_bytes(client, ["twice", "twice"], [a, b])
    assert 0 in results and set(results) <= {0, errors.E_BUSY}, results
    assert client.get("twice") in (a, b), "the stored value mixes both puts"


def test_put_after_delete_stores_new_bytes(client):
    client.put("reborn", b"old" * 1000)
    assert client.batch_delete(["reborn"]) == [0]
    client.put("reborn", b"new" * 1000)
    assert client.get("reborn") == b"new" * 1000
    assert client.batch_delete(["reborn", "reborn"]) in ([0, errors.E_NOT_FOUND],
                                                         [errors.E_NOT_FOUND, 0])
