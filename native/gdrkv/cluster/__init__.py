"""Cluster membership in etcd (docs/operations.md, "Cluster"): the etcd
client (etcd), the entries' format (members), a server's registration
(registration), the clients' view of the members (watcher) and
`gdrkv cluster status` (status)."""
