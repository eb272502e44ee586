/*
 * rdma_counters.c - see rdma_port_counters in rdma_dev.h: the ports'
 * counters straight from sysfs, for the metrics endpoint. Read at scrape
 * time, each a small file; nothing here touches the verbs library.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma_dev.h"

static int read_u64(const char *path, uint64_t *value)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    unsigned long long v;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    *value = v;
    return ok ? 0 : -1;
}

static void group_counters(const char *device, int port, const char *group, rdma_counter_fn *fn,
                           void *arg)
{
    char dir[512], path[768];
    rdma_sysfs_path(dir, sizeof dir, "sys/class/infiniband/%s/ports/%d/%s", device, port, group);
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        uint64_t value;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (read_u64(path, &value) == 0)
            fn(arg, device, port, group, e->d_name, value);
    }
    closedir(d);
}

void rdma_port_counters(rdma_counter_fn *fn, void *arg)
{
    char path[512];
    DIR *devices = opendir(rdma_sysfs_path(path, sizeof path, "sys/class/infiniband"));
    if (!devices)
        return;
    for (struct dirent *dev; (dev = readdir(devices));) {
        if (dev->d_name[0] == '.')
            continue;
        char ports_dir[512];
        rdma_sysfs_path(ports_dir, sizeof ports_dir, "sys/class/infiniband/%s/ports",
                        dev->d_name);
        DIR *ports = opendir(ports_dir);
        if (!ports)
            continue;
        for (struct dirent *p; (p = readdir(ports));) {
            int port = atoi(p->d_name);
            if (port <= 0)
                continue;
            group_counters(dev->d_name, port, "counters", fn, arg);
            group_counters(dev->d_name, port, "hw_counters", fn, arg);
        }
        closedir(ports);
    }
    closedir(devices);
}
