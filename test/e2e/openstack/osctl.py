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
  osctl.py --clouds FILE volume-service-up BINARY  exit 0 if cinder-scheduler/-volume is up
                                             (cinder-volume: both backends)
  osctl.py --clouds FILE seed-volume         volume types hvg-fake and hvg-image
  osctl.py --clouds FILE masakari-seed       segment hvg-segment with hosts node1, node2

Boot-from-volume and evacuation by plain API calls (admin; print JSON):
  osctl.py --clouds FILE volume-from-image NAME     volume (1 GB, type hvg-image,
                                             multiattach=False) from image hvg-fake; waits
                                             "available"; prints its id
  osctl.py --clouds FILE boot-bfv HOST NAME  volume-from-image + server booted from it on
                                             HOST (2.74), waits ACTIVE; prints server+volume id
  osctl.py --clouds FILE boot HOST NAME      ephemeral server (tiny, hvg-fake) on HOST
  osctl.py --clouds FILE server ID           status, host, task, attached volumes
  osctl.py --clouds FILE attachments VOLUME  Cinder's view: status, multiattach, attachments
                                             (id, server, host)
  osctl.py --clouds FILE force-down HOST true|false   PUT /os-services/{uuid} (2.53)
  osctl.py --clouds FILE evacuate ID         POST evacuate (2.93)
  osctl.py --clouds FILE delete-server ID    DELETE, waits 404 (its volume stays)
  osctl.py --clouds FILE delete-volume ID    DELETE
"""
import argparse
import json
import sys
import time

import yaml
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3

ENDPOINTS = {
    # type: (name, url)
    "compute": ("nova", "http://127.0.0.1:8774/v2.1"),
    "placement": ("placement", "http://127.0.0.1:8778"),
    "image": ("glance", "http://127.0.0.1:9292"),
    "network": ("neutron", "http://127.0.0.1:9696"),
    # Nova's [cinder] catalog_info looks up volumev3; gophercloud block-storage
    "volumev3": ("cinderv3", "http://127.0.0.1:8776/v3/%(project_id)s"),
    "block-storage": ("cinder", "http://127.0.0.1:8776/v3/%(project_id)s"),
    "instance-ha": ("masakari", "http://127.0.0.1:15868/v1/%(tenant_id)s"),
}
# Service users: admin + service in project "service".
SERVICE_USERS = ("nova", "placement", "glance", "cinder", "masakari")
# hvguard's X-Service-Token user: only the service role (lib.sh HVG_SVC_USER).
HVG_SVC_USER = "hvguard-service"
CLOUD = "hvguard-e2e"
CV = {"service_type": "volumev3", "interface": "public"}
NV = {"service_type": "compute", "interface": "public"}
MV = {"service_type": "instance-ha", "interface": "public"}


def session(clouds, cloud=CLOUD):
    c = yaml.safe_load(open(clouds))["clouds"][cloud]
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
    for name in SERVICE_USERS + (HVG_SVC_USER,):
        u = users.get(name) or ks.users.create(name, domain=dom, password=svc_pass)
        ks.users.update(u, password=svc_pass)
        for r in ("admin", "service") if name != HVG_SVC_USER else ("service",):
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


def volume_service_up(sess, binary):
    r = sess.get("/os-services?binary=%s" % binary, endpoint_filter=CV, raise_exc=False)
    svcs = r.json().get("services", []) if r.ok else []
    ups = [s for s in svcs if s["state"] == "up" and s["status"] == "enabled"]
    # cinder-volume: one service per backend (hvg-cinder@fake, hvg-cinder@fakeimg)
    return len(ups) >= (2 if binary == "cinder-volume" else 1)


VOLUME_TYPES = {"hvg-fake": "fake", "hvg-image": "fakeimg"}


def seed_volume(sess):
    have = {t["name"] for t in sess.get("/types", endpoint_filter=CV).json()["volume_types"]}
    for name, backend in VOLUME_TYPES.items():
        if name not in have:
            sess.post("/types", endpoint_filter=CV, json={"volume_type": {
                "name": name, "extra_specs": {"volume_backend_name": backend}}})


def masakari_seed(sess):
    h = {"OpenStack-API-Version": "instance-ha 1.0"}
    segs = sess.get("/segments", endpoint_filter=MV, headers=h).json()["segments"]
    seg = next((x for x in segs if x["name"] == "hvg-segment"), None)
    if seg is None:
        seg = sess.post("/segments", endpoint_filter=MV, headers=h, json={"segment": {
            "name": "hvg-segment", "recovery_method": "auto", "service_type": "COMPUTE",
            "description": "hvguard e2e: node1 and node2"}}).json()["segment"]
    hosts = {x["name"] for x in sess.get("/segments/%s/hosts" % seg["uuid"], endpoint_filter=MV,
                                         headers=h).json()["hosts"]}
    for n in ("node1", "node2"):
        if n not in hosts:
            sess.post("/segments/%s/hosts" % seg["uuid"], endpoint_filter=MV, headers=h,
                      json={"host": {"name": n, "type": "COMPUTE", "control_attributes": "SSH"}})


def wait(what, f, secs=180):
    t = time.time() + secs
    while True:
        v = f()
        if v:
            return v
        if time.time() > t:
            raise SystemExit("timed out after %ds waiting for %s" % (secs, what))
        time.sleep(0.5)


def image_id(sess, name="hvg-fake"):
    ep = {"service_type": "image", "interface": "public"}
    imgs = [i for i in sess.get("/v2/images?name=%s" % name, endpoint_filter=ep).json()["images"]
            if i["status"] == "active"]
    if not imgs:
        raise SystemExit("no active image %s (run up.sh)" % name)
    return imgs[0]["id"]


def volume(sess, vid):
    return sess.get("/volumes/%s" % vid, endpoint_filter=CV).json()["volume"]


def volume_from_image(sess, name):
    v = sess.post("/volumes", endpoint_filter=CV, json={"volume": {
        "name": name, "size": 1, "imageRef": image_id(sess), "volume_type": "hvg-image",
        "multiattach": False}}).json()["volume"]

    def ready():
        st = volume(sess, v["id"])["status"]
        if st == "error":
            raise SystemExit("volume %s went to error (see log/cinder-volume.log)" % v["id"])
        return st == "available"
    wait("volume %s available" % v["id"], ready)
    return v["id"]


def server(sess, sid):
    r = sess.get("/servers/%s" % sid, endpoint_filter=NV, raise_exc=False)
    if r.status_code == 404:
        return None
    s = r.json()["server"]
    return {"id": s["id"], "name": s["name"], "status": s["status"],
            "host": s.get("OS-EXT-SRV-ATTR:host"), "task_state": s.get("OS-EXT-STS:task_state"),
            "volumes": [a["id"] for a in s.get("os-extended-volumes:volumes_attached", [])]}


def wait_server(sess, sid, status, host=None):
    def ok():
        s = server(sess, sid)
        if s and s["status"] == "ERROR" and status != "ERROR":
            raise SystemExit("server %s went to ERROR" % sid)
        return s and s["status"] == status and not s["task_state"] and (
            host is None or s["host"] == host) and s
    return wait("server %s %s on %s" % (sid, status, host), ok)


def boot(sess, host, name, vol=None):
    body = {"name": name, "flavorRef": "tiny", "networks": "none", "host": host}
    if vol:
        body["imageRef"] = ""
        body["block_device_mapping_v2"] = [{"boot_index": 0, "uuid": vol, "source_type": "volume",
                                            "destination_type": "volume",
                                            "delete_on_termination": False}]
    else:
        body["imageRef"] = image_id(sess)
    s = sess.post("/servers", endpoint_filter=NV, json={"server": body},
                  headers={"OpenStack-API-Version": "compute 2.74"}).json()["server"]
    return wait_server(sess, s["id"], "ACTIVE", host)


def attachments(sess, vid):
    v = volume(sess, vid)
    return {"id": v["id"], "status": v["status"], "multiattach": v["multiattach"],
            "attachments": [{"attachment_id": a["attachment_id"], "server_id": a["server_id"],
                             "host_name": a.get("host_name")} for a in v["attachments"]]}


def force_down(sess, host, down):
    h = {"OpenStack-API-Version": "compute 2.53"}
    svc = sess.get("/os-services?binary=nova-compute&host=%s" % host, endpoint_filter=NV,
                   headers=h).json()["services"][0]
    sess.put("/os-services/%s" % svc["id"], endpoint_filter=NV, headers=h,
             json={"forced_down": down})


def evacuate(sess, sid):
    sess.post("/servers/%s/action" % sid, endpoint_filter=NV, json={"evacuate": {}},
              headers={"OpenStack-API-Version": "compute 2.93"})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--clouds", required=True)
    p.add_argument("--cloud", default=CLOUD)
    p.add_argument("cmd")
    p.add_argument("arg", nargs="?")
    p.add_argument("since", nargs="?")
    a = p.parse_args()
    sess, region = session(a.clouds, a.cloud)
    out = None
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
    elif a.cmd == "volume-service-up":
        return 0 if volume_service_up(sess, a.arg) else 1
    elif a.cmd == "seed-volume":
        seed_volume(sess)
    elif a.cmd == "masakari-seed":
        masakari_seed(sess)
    elif a.cmd == "volume-from-image":
        out = {"volume": volume_from_image(sess, a.arg)}
    elif a.cmd == "boot-bfv":
        vid = volume_from_image(sess, a.since)
        out = {"server": boot(sess, a.arg, a.since, vid)["id"], "volume": vid}
    elif a.cmd == "boot":
        out = {"server": boot(sess, a.arg, a.since)["id"]}
    elif a.cmd == "server":
        out = server(sess, a.arg)
    elif a.cmd == "attachments":
        out = attachments(sess, a.arg)
    elif a.cmd == "force-down":
        force_down(sess, a.arg, a.since == "true")
    elif a.cmd == "evacuate":
        evacuate(sess, a.arg)
    elif a.cmd == "delete-server":
        sess.delete("/servers/%s" % a.arg, endpoint_filter=NV, raise_exc=False)
        wait("server %s gone" % a.arg, lambda: server(sess, a.arg) is None)
    elif a.cmd == "delete-volume":
        sess.delete("/volumes/%s" % a.arg, endpoint_filter=CV, raise_exc=False)
    else:
        p.error("unknown command " + a.cmd)
    if out is not None:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
