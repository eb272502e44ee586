"""The clients' view of a cluster: one Membership per (etcd endpoints,
cluster name) in a process, shared by every client of that cluster
(shared() / release()). Its thread reads the members' entries, then
watches the prefix and hands each new table to the subscribed clients
(which pass it to the C client: gdrkv_client_set_members).

When etcd cannot be reached the last table stays: the thread counts the
failure (etcd_errors), logs it at most every few seconds and tries again,
and no client call ever waits for it. When etcd answers again the table is
read afresh, so nothing that changed meanwhile is missed.
"""
import logging
import threading
import time
import weakref

from ..errors import E_CLOSED, GdrkvError
from .etcd import Etcd, EtcdError, WatchIdle
from .members import parse_entry, prefix

log = logging.getLogger("gdrkv.cluster")

_REQUEST_TIMEOUT_S = 1.0
# A quiet watch is re-made this often, which also notices an etcd that
# hangs without closing the connection.
_WATCH_IDLE_S = 10.0
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.05, 1.0
_LOG_EVERY_S = 10.0

_shared = {}
_shared_lock = threading.Lock()


def shared(endpoints, name):
    """The process's Membership of that cluster, started on first use;
    every shared() needs a release()."""
    key = (tuple(endpoints), name)
    with _shared_lock:
        membership = _shared.get(key)
        if membership is None:
            membership = _shared[key] = Membership(endpoints, name)
        membership.users += 1
        return membership


def release(membership):
    with _shared_lock:
        membership.users -= 1
        if membership.users:
            return
        del _shared[(tuple(membership.etcd.endpoints), membership.name)]
    membership.stop()


def _table(by_key):
    """What the clients' tables are made of: each member's address,
    capacity, zone and state (not when it registered)."""
    return {key: member[:4] for key, member in by_key.items()}


class Membership:
    def __init__(self, endpoints, name):
        self.name = name
        self.etcd = Etcd(endpoints, timeout_s=_REQUEST_TIMEOUT_S)
        self.users = 0
        self.etcd_errors = 0
        # Set once the first read of the members is over, done or failed.
        self.first_read = threading.Event()
        self._prefix = prefix(name)
        self._by_key = {}               # entry key -> Member
        self._subscribers = []          # weakref.WeakMethod of each client's callback
        self._lock = threading.Lock()   # _by_key, _subscribers
        # Held while tables are handed out, so that each subscriber gets
        # them in order (its first one from subscribe included).
        self._deliver_lock = threading.Lock()
        self._stop = threading.Event()
        self._watch = None
        self._last_log = 0.0
        self._thread = threading.Thread(target=self._run, name=f"gdrkv-watch-{name}",
                                        daemon=True)
        self._thread.start()

    def members(self):
        """The members now, sorted by address."""
        with self._lock:
            return sorted(self._by_key.values())

    def subscribe(self, method):
        """Calls method(members) now and after every change of the table
        (from the watcher's thread), until unsubscribe or the method's
        object is gone."""
        with self._deliver_lock:
            with self._lock:
                self._subscribers.append(weakref.WeakMethod(method))
                current = sorted(self._by_key.values())
            method(current)

    def unsubscribe(self, method):
        with self._lock:
            self._subscribers = [s for s in self._subscribers if s() not in (None, method)]

    def stop(self):
        self._stop.set()
        watch = self._watch
        if watch:
            watch.interrupt()
        self._thread.join()

    # ------------------------------------------------------------ the thread

    def _replace(self, by_key):
        """Makes by_key the table; tells the subscribers when it changed."""
        with self._deliver_lock:
            with self._lock:
                same = _table(by_key) == _table(self._by_key)
                self._by_key = by_key
                if same:            # a member registered again, on a new lease
                    return
                current = sorted(by_key.values())
                callbacks = [s() for s in self._subscribers]
            log.info("gdrkv cluster %s: %d members: %s", self.name, len(current),
                     ", ".join(f"{m.addr} ({m.state})" for m in current))
            for callback in callbacks:
                if callback is not None:
                    callback(current)

    def _apply(self, batch):
        by_key = dict(self._by_key)
        for kind, key, value in batch:
            member = parse_entry(self.name, key, value) if kind == "PUT" else None
            if member:
                by_key[key] = member
            else:
                by_key.pop(key, None)
        self._replace(by_key)

    def _follow(self):
        revision, entries = self.etcd.range_prefix(self._prefix)
        by_key = {}
        for key, value, _ in entries:
            member = parse_entry(self.name, key, value)
            if member:
                by_key[key] = member
        self._replace(by_key)
        self.first_read.set()
        self._backoff = _BACKOFF_MIN_S
        self._watch = self.etcd.watch(self._prefix, revision + 1, _WATCH_IDLE_S)
        if self._stop.is_set():
            return
        for batch in self._watch.events():
            self._apply(batch)

    def _failed(self, error):
        self.etcd_errors += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning("gdrkv cluster %s: etcd: %s; keeping the last %d members "
                        "(%d etcd errors so far)", self.name, error, len(self._by_key),
                        self.etcd_errors)

    def _run(self):
        self._backoff = _BACKOFF_MIN_S
        while not self._stop.is_set():
            try:
                self._follow()
            except WatchIdle:
                continue
            except Exception as e:      # etcd's failures; a bug too must not stop the thread
                if self._stop.is_set():
                    break
                if not isinstance(e, (EtcdError, OSError)):
                    log.exception("gdrkv cluster %s: following the members", self.name)
                self._failed(e)
                self.first_read.set()
                self._stop.wait(self._backoff)
                self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
            finally:
                if self._watch:
                    self._watch.close()
                    self._watch = None


class Follower:
    """A client following its cluster (gdrkv+etcd://E1,E2/NAME): the
    process's shared Membership hands every new table to the client's
    _set_members. Open waits for the first read of the members for at most
    wait_s; when etcd has not answered by then the client starts with no
    members (keys fail UNAVAILABLE) and gets them as soon as it does."""

    def __init__(self, client, endpoints, name, wait_s):
        self._client = weakref.ref(client)
        self.membership = shared(endpoints, name)
        # A client dropped without close() lets the membership go too.
        self._release = weakref.finalize(self, release, self.membership)
        self.membership.first_read.wait(wait_s)
        self.membership.subscribe(self._members)

    @property
    def etcd_errors(self):
        return self.membership.etcd_errors

    def _members(self, members):
        client = self._client()
        if client is None:
            return
        try:
            client._set_members([(m.addr, m.capacity, m.zone, m.leaving) for m in members])
        except GdrkvError as e:
            if e.code != E_CLOSED:
                log.warning("gdrkv cluster %s: the client refused the members: %s",
                            self.membership.name, e)
        except ValueError as e:
            log.warning("gdrkv cluster %s: the client refused the members: %s",
                        self.membership.name, e)

    def stop(self):
        self.membership.unsubscribe(self._members)
        self._release()
