#!/usr/bin/env python3
"""lvctl.py — readiness probes and seeding for libvirt-compute.sh (node3).

  lvctl.py --clouds FILE ready HOST     exit 0 if nova-compute on HOST is up and
                                        Nova lists a hypervisor served by HOST

                                        (GET /os-hypervisors/detail works for it)
  lvctl.py --clouds FILE seed KERNEL INITRD
        flavor "lv256" (256 MB, 1 vCPU, 1 GB), images hvg-lv-kernel (aki),
        hvg-lv-ramdisk (ari) and hvg-lv-root (1 MiB raw, kernel_id, ramdisk_id,
        os_command_line) — the tiny busybox guest of test/guest for Nova's
        libvirt driver. Idempotent: active images of the same name are kept.
"""
import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from osctl import get, session  # noqa: E402  (same directory)

CMDLINE = "console=ttyS0 quiet panic=1"
PROJECT = "hvg-lv"


def ready(sess, host):
    r = get(sess, "compute", "/os-services?binary=nova-compute&host=%s" % host, "2.53")
    svcs = r.json().get("services", []) if r.ok else []
    if not any(s["state"] == "up" and not s["forced_down"] for s in svcs):
        return False
    return mapped(sess, host)


def mapped(sess, host):
    r = get(sess, "compute", "/os-hypervisors/detail", "2.53")
    return r.ok and any(h.get("service", {}).get("host") == host for h in r.json()["hypervisors"])


def image(sess, name, path, disk, container, props):
    ep = {"service_type": "image", "interface": "public"}
    imgs = sess.get("/v2/images?name=%s" % name, endpoint_filter=ep).json()["images"]
    for i in imgs:
        if i["status"] == "active":
            return i["id"]
    for i in imgs:
        sess.delete("/v2/images/%s" % i["id"], endpoint_filter=ep)
    body = {"name": name, "disk_format": disk, "container_format": container, "visibility": "public"}
    body.update(props)
    img = sess.post("/v2/images", endpoint_filter=ep, json=body).json()
    if path is None:
        data = b"\0" * 1048576
    else:
        with open(path, "rb") as f:
            data = f.read()
    sess.put("/v2/images/%s/file" % img["id"], endpoint_filter=ep, data=data,
             headers={"Content-Type": "application/octet-stream"})
    print("uploaded %s %s (%d bytes)" % (name, img["id"], len(data)))
    return img["id"]


def project(sess):
    from keystoneclient.v3 import client as ks_client  # only here: slow import
    ks = ks_client.Client(session=sess, interface="public")
    projs = ks.projects.list(name=PROJECT)
    p = projs[0] if projs else ks.projects.create(PROJECT, "default", description="hvguard libvirt-driver storms")
    admin = ks.users.list(name="admin")[0]
    role = ks.roles.list(name="admin")[0]
    ks.roles.grant(role, user=admin, project=p)
    r = sess.put("/os-quota-sets/%s" % p.id, endpoint_filter={"service_type": "compute", "interface": "public"},
                 json={"quota_set": {"instances": -1, "cores": -1, "ram": -1}})
    r.raise_for_status()


def seed(sess, kernel, initrd):
    ep = {"service_type": "compute", "interface": "public"}
    project(sess)
    r = get(sess, "compute", "/flavors/lv256", "2.1")
    if r.status_code == 404:
        sess.post("/flavors", endpoint_filter=ep, json={"flavor": {
            "name": "lv256", "id": "lv256", "ram": 256, "vcpus": 1, "disk": 1}})
    k = image(sess, "hvg-lv-kernel", kernel, "aki", "aki", {})
    rd = image(sess, "hvg-lv-ramdisk", initrd, "ari", "ari", {})
    image(sess, "hvg-lv-root", None, "raw", "bare",
          {"kernel_id": k, "ramdisk_id": rd, "os_command_line": CMDLINE})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clouds", required=True)
    p.add_argument("cmd")
    p.add_argument("args", nargs="*")
    a = p.parse_args()
    sess, _ = session(a.clouds)
    if a.cmd == "ready":
        return 0 if ready(sess, a.args[0]) else 1
    if a.cmd == "mapped":
        return 0 if mapped(sess, a.args[0]) else 1
    if a.cmd == "seed":
        seed(sess, a.args[0], a.args[1])
        return 0
    p.error("unknown command " + a.cmd)


if __name__ == "__main__":
    sys.exit(main())
