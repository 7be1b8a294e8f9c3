"""Validates deploy/: the Kubernetes manifests parse and agree with each other and with the server
config they carry (checked by kimi-server --check-config), the launch script parses, and the
Dockerfile is multi-stage on Debian 12 and runs as a non-root user.

Usage: /usr/bin/python3 tests/deploy/manifests_test.py --kimi-server build/bin/kimi-server
"""
import argparse
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    print(f"FAIL {msg}")
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print(f"ok   {msg}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kimi-server", required=True)
    a = ap.parse_args()
    with open(os.path.join(ROOT, "deploy/k8s/kimi-serve.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {d["kind"]: d for d in docs}
    check(set(by_kind) == {"ConfigMap", "LeaderWorkerSet", "Service"},
          f"manifests define ConfigMap, LeaderWorkerSet, Service (got {sorted(by_kind)})")
    for d in docs:
        check("apiVersion" in d and "metadata" in d and "name" in d["metadata"],
              f"{d['kind']} has apiVersion and metadata.name")
    lws = by_kind["LeaderWorkerSet"]
    check(lws["apiVersion"].startswith("leaderworkerset.x-k8s.io/"), "LWS apiVersion")
    tmpl = lws["spec"]["leaderWorkerTemplate"]

    config_text = by_kind["ConfigMap"]["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    par = config.get("parallel", {})
    tp, ep, pp = par.get("tp", 1), par.get("ep", 1), par.get("pp", 1)
    check(tmpl["size"] == pp * max(tp, ep),
          f"group size {tmpl['size']} = pp x max(tp, ep) = {pp * max(tp, ep)} (one rank per pod)")

    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    worker = tmpl["workerTemplate"]["spec"]["containers"][0]
    grpc_port = int(config["server"]["listen"].rsplit(":", 1)[1])
    metrics_port = int(config["server"]["metrics_listen"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in leader["ports"]}
    check(ports.get("grpc") == grpc_port and ports.get("metrics") == metrics_port,
          "leader container ports match server.listen and server.metrics_listen")
    check(leader["readinessProbe"].get("grpc", {}).get("port") == grpc_port,
          "leader readiness is the gRPC health check on the gRPC port")
    check("tcpSocket" in worker["readinessProbe"], "workers are ready when sshd listens")
    drain = config.get("server", {}).get("drain_timeout_seconds", 30)
    for pod in ("leaderTemplate", "workerTemplate"):
        spec = tmpl[pod]["spec"]
        sc = spec.get("securityContext", {})
        check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0,
              f"{pod} runs as a non-root user")
        check(sc.get("fsGroup") == sc.get("runAsUser"),
              f"{pod}: fsGroup lets that user read the mounted secrets")
        check(spec.get("terminationGracePeriodSeconds", 30) > drain,
              f"{pod}: the grace period outlasts server.drain_timeout_seconds ({drain} s)")
    header = open(os.path.join(ROOT, "deploy/k8s/kimi-serve.yaml")).read().split("apiVersion")[0]
    for vol in tmpl["leaderTemplate"]["spec"]["volumes"]:
        if "secret" in vol:
            name = vol["secret"]["secretName"]
            check(f"secret generic {name}" in header, f"the set-up steps create secret {name}")

    svc = by_kind["Service"]
    labels = tmpl["leaderTemplate"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
          "the Service selects the leader pods only")
    check({p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports),
          "Service target ports are named leader ports")

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config_text)
        path = f.name
    r = subprocess.run([a.kimi_server, "--config", path, "--check-config"], capture_output=True,
                       text=True)
    os.remove(path)
    check(r.returncode == 0, f"kimi-server --check-config accepts the ConfigMap's config "
                             f"({(r.stdout + r.stderr).strip()})")

    r = subprocess.run(["bash", "-n", os.path.join(ROOT, "deploy/k8s/launch.sh")],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"launch.sh parses ({r.stderr.strip()})")

    with open(os.path.join(ROOT, "deploy/docker/Dockerfile")) as f:
        lines = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    froms = [l for l in lines if l.startswith("FROM ")]
    check(len(froms) == 2 and all("debian:12" in l for l in froms),
          "Dockerfile is multi-stage on Debian 12")
    users = [l for l in lines if l.startswith("USER ")]
    check(users and users[-1] not in ("USER root", "USER 0"), "the image runs as a non-root user")
    check(any(l.startswith("EXPOSE") and "50051" in l and "9464" in l for l in lines),
          "the image exposes the gRPC and metrics ports")
    # Every shared library the copied binaries need is in the runtime stage (kimi-gateway's
    # cpp-httplib was missing: the gateway could not start in the image).
    runtime = " ".join(lines[lines.index(froms[1]):])
    for package in ("libgrpc++1.51", "libcpp-httplib0.11", "libprometheus-cpp-pull1.0",
                    "libyaml-cpp0.7", "openmpi-bin"):
        check(package in runtime, f"the runtime stage installs {package}")
    print("all deploy checks passed")


if __name__ == "__main__":
    main()
