#!/usr/bin/env python3
"""osctl.py — identity bootstrap, seeding and readiness probes for up.sh.

One Python process per step instead of many `openstack` CLI calls (each CLI
call costs 1-2 s of imports on 2 cores). Uses keystoneauth1 and
python3-keystoneclient, which python3-keystone already depends on.

  osctl.py --clouds FILE identity SVC_PASS   projects, roles, users, services, endpoints
  osctl.py --clouds FILE compute-up HOST     exit 0 if nova-compute on HOST is up
  osctl.py --clouds FILE compute-reported HOST SINCE  exit 0 if its service record is newer
  osctl.py --clouds FILE computes-ready HOST [HOST]  exit 0 if each is up (or forced down) and in placement
  osctl.py --clouds FILE rp-exists HOST      exit 0 if placement has provider HOST
  osctl.py --clouds FILE hypervisors N       exit 0 if Nova lists >= N hypervisors
  osctl.py --clouds FILE seed IMAGE_FILE     flavor "tiny" and image "hvg-fake"
"""
import argparse
import sys

import yaml
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3

ENDPOINTS = {
    # type: (name, url)
    "compute": ("nova", "http://127.0.0.1:8774/v2.1"),
    "placement": ("placement", "http://127.0.0.1:8778"),
    "image": ("glance", "http://127.0.0.1:9292"),
    "network": ("neutron", "http://127.0.0.1:9696"),
}


def session(clouds):
    c = yaml.safe_load(open(clouds))["clouds"]["hvguard-e2e"]
    a = c["auth"]
    auth = v3.Password(auth_url=a["auth_url"], username=a["username"], password=a["password"],
                       project_name=a["project_name"], user_domain_name=a["user_domain_name"],
                       project_domain_name=a["project_domain_name"])
    return ks_session.Session(auth=auth, timeout=30), c["region_name"]


def identity(sess, region, svc_pass):
    from keystoneclient.v3 import client as ks_client  # only here: slow import
    ks = ks_client.Client(session=sess, interface="public")
    dom = ks.domains.get("default")
    proj = {p.name: p for p in ks.projects.list()}
    if "service" not in proj:
        proj["service"] = ks.projects.create("service", dom, description="hvguard e2e services")
    roles = {r.name: r for r in ks.roles.list()}
    for r in ("service", "admin"):
        if r not in roles:
            roles[r] = ks.roles.create(r)
    users = {u.name: u for u in ks.users.list()}
    for name in ("nova", "placement", "glance"):
        u = users.get(name) or ks.users.create(name, domain=dom, password=svc_pass)
        ks.users.update(u, password=svc_pass)
        for r in ("admin", "service"):
            ks.roles.grant(roles[r], user=u, project=proj["service"])
    services = {s.type: s for s in ks.services.list()}
    eps = ks.endpoints.list()
    for typ, (name, url) in ENDPOINTS.items():
        s = services.get(typ) or ks.services.create(name, type=typ)
        for iface in ("public", "internal", "admin"):
            if not any(e.service_id == s.id and e.interface == iface for e in eps):
                ks.endpoints.create(s, url, interface=iface, region=region)


def get(sess, service, path, mv=None):
    h = {"OpenStack-API-Version": "compute %s" % mv} if mv else {}
    return sess.get(path, endpoint_filter={"service_type": service, "interface": "public"},
                    headers=h, raise_exc=False)


def compute_up(sess, host):
    r = get(sess, "compute", "/os-services?binary=nova-compute&host=%s" % host, "2.53")
    svcs = r.json().get("services", []) if r.ok else []
    return any(s["state"] == "up" and not s["forced_down"] for s in svcs)


def compute_reported(sess, host, since):
    """True once nova-compute on host refreshed its service record at or after since (UTC)."""
    r = get(sess, "compute", "/os-services?binary=nova-compute&host=%s" % host, "2.53")
    svcs = r.json().get("services", []) if r.ok else []
    return any((s.get("updated_at") or "")[:19] >= since for s in svcs)


def rp_exists(sess, host):
    r = sess.get("/resource_providers?name=%s" % host,
                 endpoint_filter={"service_type": "placement", "interface": "public"},
                 headers={"OpenStack-API-Version": "placement 1.14"}, raise_exc=False)
    return r.ok and len(r.json()["resource_providers"]) == 1


def computes_ready(sess, hosts):
    """Each host's nova-compute is up and has its resource provider in placement."""
    ok = True
    for h in hosts:
        r = get(sess, "compute", "/os-services?binary=nova-compute&host=%s" % h, "2.53")
        svcs = r.json().get("services", []) if r.ok else []
        if any(s["forced_down"] for s in svcs):
            # left forced down by a test: its state stays "down" whatever the process does
            print("warning: nova-compute on %s is forced down (osharness RestoreHost clears it)" % h,
                  file=sys.stderr)
        elif not any(s["state"] == "up" for s in svcs):
            ok = False
        ok = ok and rp_exists(sess, h)
    return ok


def hypervisors(sess, n):
    r = get(sess, "compute", "/os-hypervisors", "2.53")
    return r.ok and len(r.json()["hypervisors"]) >= n


def seed(sess, image_file):
    ep = {"service_type": "compute", "interface": "public"}
    r = get(sess, "compute", "/flavors/tiny", "2.1")
    if r.status_code == 404:
        sess.post("/flavors", endpoint_filter=ep, json={"flavor": {
            "name": "tiny", "id": "tiny", "ram": 64, "vcpus": 1, "disk": 1}})
    ep = {"service_type": "image", "interface": "public"}
    imgs = sess.get("/v2/images?name=hvg-fake", endpoint_filter=ep).json()["images"]
    if imgs and imgs[0]["status"] == "active":
        return
    for i in imgs:
        sess.delete("/v2/images/%s" % i["id"], endpoint_filter=ep)
    img = sess.post("/v2/images", endpoint_filter=ep, json={
        "name": "hvg-fake", "disk_format": "raw", "container_format": "bare",
        "visibility": "public"}).json()
    with open(image_file, "rb") as f:
        sess.put("/v2/images/%s/file" % img["id"], endpoint_filter=ep, data=f.read(),
                 headers={"Content-Type": "application/octet-stream"})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clouds", required=True)
    p.add_argument("cmd")
    p.add_argument("arg", nargs="?")
    p.add_argument("since", nargs="?")
    a = p.parse_args()
    sess, region = session(a.clouds)
    if a.cmd == "identity":
        identity(sess, region, a.arg)
    elif a.cmd == "compute-up":
        return 0 if compute_up(sess, a.arg) else 1
    elif a.cmd == "compute-reported":
        return 0 if compute_reported(sess, a.arg, a.since) else 1
    elif a.cmd == "computes-ready":
        return 0 if computes_ready(sess, [x for x in (a.arg, a.since) if x]) else 1
    elif a.cmd == "rp-exists":
        return 0 if rp_exists(sess, a.arg) else 1
    elif a.cmd == "hypervisors":
        return 0 if hypervisors(sess, int(a.arg)) else 1
    elif a.cmd == "seed":
        seed(sess, a.arg)
    else:
        p.error("unknown command " + a.cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
