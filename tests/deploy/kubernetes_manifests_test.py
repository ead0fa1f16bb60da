#!/usr/bin/python3
"""Renders every kustomize overlay in deploy/kubernetes/overlays offline and checks it.

- `kubectl kustomize` renders each overlay (no cluster needed).
- Each object is checked against the Kubernetes API's types from python3-kubernetes:
  every field must exist in the type (a misspelt field is an error here, where
  kubectl apply would drop or reject it), scalars must have the field's type (an
  unquoted number in an annotation is rejected by the API server), and required fields
  must be present. The client library predates gRPC probes; `grpc` in a probe is
  checked by hand against the API's GRPCAction (port, service).
- What an operator needs from these manifests: one replica with the Recreate strategy,
  startup/readiness/liveness probes, requests and a memory limit, a restricted security
  context, scrape annotations naming the metrics port, a fully qualified image, and on
  GPU overlays the GPU limit, toleration, node selector and runtime class.
- Every server listening off loopback authenticates its callers (--tokens-file or
  --tls-client-ca from a mounted Secret): the image passes --allow-insecure-remote.
- A sharded overlay (a StatefulSet of servers behind an HAProxy Deployment): a headless
  Service publishing unready pods, disruption budgets, spread over hosts, each pod's
  name as --replica-name, --persist-dir on its claim with --snapshot-interval, TLS; every
  placement row names a pod of the StatefulSet; HAProxy's backends are those pods at
  their headless Service names; the committed haproxy.cfg is what deploy/placement.py
  writes for them and the proxy's mounts; `haproxy -c` accepts it (where haproxy is
  installed). Its SNI route listens on the proxy's port grpc-sni, which a Service
  publishes, and every tenant of the table is a DNS label it can name. HAProxy's pods
  are in the Guaranteed QoS class with whole CPUs, so that under the static CPU manager
  policy they get cores of their own; haproxy.cfg is generated with --threads equal to
  those CPUs and --busy-poll, and wherever it has busy-polling, the container's CPU
  request equals its limit, is whole and equals nbthread (a spinning thread needs a core
  of its own). Mistakes made in a copy of the rendered overlay must be caught.
- yamllint checks the sources (deploy/kubernetes, deploy/compose.yaml), and
  docker-compose (where installed) checks deploy/compose.yaml against the Compose schema.
- A deliberately broken manifest must be rejected, so the checks themselves are tested.

Usage: kubernetes_manifests_test.py DEPLOY_DIR. Exit 0 when all pass, 1 on failures,
77 (skipped) when kubectl, yamllint or python3-kubernetes is missing.
"""
import copy as copy_module
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


try:
    import yaml
    import kubernetes.client as k8s
except ImportError as e:
    skip(f"python3-kubernetes and python3-yaml are needed ({e}); deploy/install-deps.sh installs them")

KINDS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}
# Fields newer than the client library's types: (type, field) -> checker of the value.
NEWER_FIELDS = {
    ("V1Probe", "grpc"): lambda v, path: check_grpc_action(v, path),
}
# Maps whose values are quantities (int or string), not strings only.
QUANTITY_MAPS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")}


def check_grpc_action(value, path):
    errors = []
    if not isinstance(value, dict):
        return [f"{path}: must be an object"]
    for key in value:
        if key not in ("port", "service"):
            errors.append(f"{path}.{key}: unknown field (GRPCAction has port and service)")
    if not isinstance(value.get("port"), int) or isinstance(value.get("port"), bool):
        errors.append(f"{path}.port: required, an integer")
    if "service" in value and not isinstance(value["service"], str):
        errors.append(f"{path}.service: must be a string")
    return errors


def check_scalar(value, type_name, path):
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "object": isinstance(value, (str, int, dict, list)) and not isinstance(value, bool),
        "datetime": isinstance(value, str),
        "date": isinstance(value, str),
    }.get(type_name)
    if ok is None:
        return [f"{path}: unknown type {type_name}"]
    return [] if ok else [f"{path}: {value!r} is not a {type_name}"]


def check(value, type_name, path, owner=None):
    """Errors of `value` against the client library's type `type_name`."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: must be a list"]
        inner = type_name[5:-1]
        return [e for i, v in enumerate(value) for e in check(v, inner, f"{path}[{i}]")]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            return [f"{path}: must be a map"]
        inner = type_name[type_name.index(",") + 1:-1].strip()
        errors = []
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: key {k!r} is not a string")
            if owner in QUANTITY_MAPS and isinstance(v, (int, float)) and not isinstance(v, bool):
                continue
            errors += check(v, inner, f"{path}.{k}")
        return errors
    model = getattr(k8s, type_name, None)
    if model is None:
        return check_scalar(value, type_name, path)
    if not isinstance(value, dict):
        return [f"{path}: must be an object ({type_name})"]
    by_json = {json: attr for attr, json in model.attribute_map.items()}
    errors = []
    for key, v in value.items():
        if (type_name, key) in NEWER_FIELDS:
            errors += NEWER_FIELDS[(type_name, key)](v, f"{path}.{key}")
        elif key not in by_json:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
        elif v is not None:
            errors += check(v, model.openapi_types[by_json[key]], f"{path}.{key}", (type_name, key))
    return errors


def validate_schema(obj):
    """Schema errors of one object: unknown fields, wrong types, missing required fields."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    name = (obj.get("metadata") or {}).get("name", "?")
    where = f"{kind}/{name}"
    type_name = KINDS.get((api_version, kind))
    if type_name is None:
        return [f"{where}: no schema here for {api_version} {kind}"]
    errors = check(obj, type_name, where)
    if errors:
        return errors
    # The library's constructors check required fields and some enumerations.
    try:
        k8s.ApiClient()._ApiClient__deserialize(strip_newer(obj), type_name)
    except (ValueError, TypeError) as e:
        errors.append(f"{where}: {e}")
    return errors


def strip_newer(value):
    """A copy without the fields the library does not know (checked separately)."""
    if isinstance(value, list):
        return [strip_newer(v) for v in value]
    if isinstance(value, dict):
        return {k: strip_newer(v) for k, v in value.items() if k != "grpc"}
    return value


def probe_ports(probe):
    for kind in ("grpc", "httpGet", "tcpSocket"):
        if kind in probe:
            return probe[kind].get("port")
    return None


def qualified(image):
    """registry/name[:tag]: a first component that is a host (has '.' or ':' or is localhost)."""
    first = image.split("/")[0]
    return "/" in image and ("." in first or ":" in first or first == "localhost")


def labelled(objects):
    errors = []
    for o in objects:
        labels = o["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"):
            if key not in labels:
                errors.append(f"{o['kind']}/{o['metadata']['name']}: no label {key}")
    return errors


def check_workload(workload, gpu, scraped=True):
    """What an operator needs of a Deployment's or StatefulSet's pods."""
    errors = []
    name = f"{workload['kind']} {workload['metadata']['name']}"
    spec = workload["spec"]
    pod = spec["template"]["spec"]
    template_labels = spec["template"]["metadata"].get("labels", {})
    for k, v in spec["selector"]["matchLabels"].items():
        if template_labels.get(k) != v:
            errors.append(f"{name}: selector {k}={v} does not match the pod template")
    if not isinstance(pod.get("terminationGracePeriodSeconds"), int):
        errors.append(f"{name}: no terminationGracePeriodSeconds")
    psc = pod.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        errors.append(f"{name}: pod securityContext.runAsNonRoot must be true")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        errors.append(f"{name}: pod seccompProfile must be RuntimeDefault")
    metrics_port = None
    for c in pod["containers"]:
        where = f"{name}: container {c['name']}"
        if not qualified(c["image"]):
            errors.append(f"{where}: image {c['image']} has no registry (it would be pulled from Docker Hub)")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in c:
                errors.append(f"{where}: no {probe}")
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        tls = any(str(a).startswith("--tls-cert") for a in c.get("args", []))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe not in c:
                continue
            port = probe_ports(c[probe])
            if port not in ports.values() and port not in ports:
                errors.append(f"{where}: {probe} probes a port the container does not expose")
            if tls and c["name"] == "server" and "httpGet" not in c[probe]:
                errors.append(f"{where}: {probe} of a TLS server must ask the metrics port's "
                              "/readyz (a TCP probe passes while the server shuts down or "
                              "has a failed device)")
            if tls and "grpc" in c[probe]:
                errors.append(f"{where}: {probe} is a gRPC probe of a TLS server (the kubelet's "
                              "gRPC probe speaks plaintext)")
            http_path = c[probe].get("httpGet", {}).get("path")
            if c["name"] == "server" and http_path is not None and http_path != "/readyz":
                errors.append(f"{where}: {probe} asks {http_path}; the server answers readiness "
                              "on the metrics port's /readyz")
        metrics_port = ports.get("metrics", metrics_port)
        resources = c.get("resources", {})
        for r in ("cpu", "memory"):
            if r not in resources.get("requests", {}):
                errors.append(f"{where}: no {r} request")
        if "memory" not in resources.get("limits", {}):
            errors.append(f"{where}: no memory limit")
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{where}: readOnlyRootFilesystem must be true")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            errors.append(f"{where}: capabilities must drop ALL")
        gpus = resources.get("limits", {}).get("nvidia.com/gpu")
        if gpu and not (isinstance(gpus, int) and gpus >= 1):
            errors.append(f"{where}: a GPU overlay must limit nvidia.com/gpu to at least 1")
        if not gpu and gpus is not None:
            errors.append(f"{where}: asks for GPUs it does not use")
    if scraped:
        annotations = spec["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true":
            errors.append(f"{name}: no prometheus.io/scrape annotation")
        if metrics_port is None or annotations.get("prometheus.io/port") != str(metrics_port):
            errors.append(f"{name}: prometheus.io/port {annotations.get('prometheus.io/port')} is not the metrics port")
    if gpu:
        if not pod.get("runtimeClassName"):
            errors.append(f"{name}: a GPU overlay needs a runtimeClassName")
        if not pod.get("nodeSelector"):
            errors.append(f"{name}: a GPU overlay needs a nodeSelector")
        if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])):
            errors.append(f"{name}: a GPU overlay needs the nvidia.com/gpu toleration")
    return errors


def selects(selector, workload):
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_services(objects):
    """Every Service selects pods, and names ports those pods have."""
    errors = []
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    for s in (o for o in objects if o["kind"] == "Service"):
        where = f"Service {s['metadata']['name']}"
        selected = [w for w in workloads if selects(s["spec"].get("selector", {}), w)]
        if not selected:
            errors.append(f"{where}: selector {s['spec'].get('selector')} matches no pod")
        port_names = {p.get("name") for w in selected for c in w["spec"]["template"]["spec"]["containers"]
                      for p in c.get("ports", [])}
        for p in s["spec"]["ports"]:
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in port_names:
                errors.append(f"{where}: targetPort {p['targetPort']} names no container port")
    return errors


def mounted(pod, container, path, kind):
    """(volume, mount) of the `kind` volume ("configMap", "secret", ...) whose mount holds
    `path` directly (not in a subdirectory), or (None, None)."""
    directory = os.path.dirname(path)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if m["mountPath"].rstrip("/") == directory and kind in volumes.get(m["name"], {}):
            return volumes[m["name"]], m
    return None, None


def server_flags(objects, pod):
    """(errors, flags) of the server container: its args and its --flagfile's lines."""
    server = pod["containers"][0]
    args = server.get("args", [])
    flagfiles = [a.split("=", 1)[1] for a in args if a.startswith("--flagfile=")]
    if len(flagfiles) != 1:
        return ["container server: args must name one --flagfile"], args
    volume, _ = mounted(pod, server, flagfiles[0], "configMap")
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    config_map = config_maps.get((volume or {}).get("configMap", {}).get("name"))
    if config_map is None:
        return [f"container server: {os.path.dirname(flagfiles[0])} is not a mounted ConfigMap of this overlay"], args
    flags = config_map.get("data", {}).get(os.path.basename(flagfiles[0]))
    if flags is None:
        return [f"ConfigMap {config_map['metadata']['name']}: no key {os.path.basename(flagfiles[0])}"], args
    errors, lines = [], []
    for line in flags.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            if line.startswith("--"):
                lines.append(line)
            else:
                errors.append(f"ConfigMap {config_map['metadata']['name']}: '{line}' is not a flag")
    return errors, lines + [a for a in args if not a.startswith("--flagfile=")]


def flag(flags, name):
    """The last value of --name (a repeated flag takes its last value), or None."""
    values = [f.split("=", 1)[1] for f in flags if f.startswith(f"--{name}=")]
    return values[-1] if values else None


# The images' entrypoint (deploy/Dockerfile, deploy/Dockerfile.cuda) listens on
# 0.0.0.0:50051 and passes --allow-insecure-remote, which serves anyone when no
# authentication is configured.
IMAGE_LISTEN = "0.0.0.0:50051"


def check_authentication(flags, pod):
    """A server listening off loopback authenticates its callers, from a mounted Secret."""
    listen = flag(flags, "listen") or IMAGE_LISTEN
    if listen.rpartition(":")[0] in ("127.0.0.1", "localhost", "[::1]"):
        return []
    errors = []
    credentials = [(f, flag(flags, f)) for f in ("tokens-file", "tls-client-ca") if flag(flags, f)]
    if not credentials:
        return [f"container server: listens on {listen} without authentication (--tokens-file or "
                "--tls-client-ca), so it would serve anyone (the image passes --allow-insecure-remote)"]
    for name, path in credentials:
        if mounted(pod, pod["containers"][0], path, "secret")[0] is None:
            errors.append(f"container server: --{name}={path} is not in a mounted Secret")
    return errors


def validate_policy(objects, gpu):
    """What an operator needs from a one-server gpucompute deployment."""
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    services = [o for o in objects if o["kind"] == "Service"]
    if len(deployments) != 1 or len(services) != 1:
        return [f"expected one Deployment and one Service, got {len(deployments)} and {len(services)}"]
    errors = labelled(objects)
    d = deployments[0]
    if d["spec"].get("replicas") != 1:
        errors.append("Deployment: replicas must be 1 (buffers live in one pod)")
    if d["spec"].get("strategy", {}).get("type") != "Recreate":
        errors.append("Deployment: strategy must be Recreate (RollingUpdate needs a second GPU)")
    errors += check_workload(d, gpu)
    errors += check_services(objects)
    pod = d["spec"]["template"]["spec"]
    flag_errors, flags = server_flags(objects, pod)
    return errors + flag_errors + check_authentication(flags, pod)


def objects_of(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def spread_over_hosts(workload):
    pod = workload["spec"]["template"]["spec"]
    return any(c.get("topologyKey") == "kubernetes.io/hostname" and
               selects(c.get("labelSelector", {}).get("matchLabels", {}), workload)
               for c in pod.get("topologySpreadConstraints", []))


def cpu_count(quantity):
    """The number of CPUs of a quantity that is a whole number of them ("4", 4, "4000m"),
    else None."""
    text = str(quantity)
    if text.endswith("m"):
        whole = text[:-1].isdigit() and int(text[:-1]) > 0 and int(text[:-1]) % 1000 == 0
        return int(text[:-1]) // 1000 if whole else None
    return int(text) if text.isdigit() and int(text) > 0 else None


def exclusive_cores(workload):
    """Errors where a pod of `workload` could not get cores of its own: the static CPU
    manager policy gives them only to a Guaranteed pod (every container's CPU and memory
    requests equal to its limits) asking for whole CPUs."""
    errors = []
    for c in workload["spec"]["template"]["spec"]["containers"]:
        resources = c.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        where = f"{workload['kind']} {workload['metadata']['name']}, container {c['name']}"
        for r in ("cpu", "memory"):
            if r not in limits or str(requests.get(r, limits[r])) != str(limits[r]):
                errors.append(f"{where}: {r} request {requests.get(r, 'none')} and limit {limits.get(r, 'none')} must be "
                              "equal (the Guaranteed QoS class)")
        if "cpu" in limits and cpu_count(limits["cpu"]) is None:
            errors.append(f"{where}: cpu {limits['cpu']} is not a whole number of CPUs (the static CPU "
                          "manager gives exclusive cores only for whole CPUs)")
    return errors


def config_sections(config):
    """[(a section's header words, [its lines' words])] of an HAProxy configuration,
    comments left out."""
    sections = []
    for line in config.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if not line[0].isspace():
            sections.append((words, []))
        elif sections:
            sections[-1][1].append(words)
    return sections


def global_settings(config):
    """{keyword: its arguments} of an HAProxy configuration's global section."""
    return {words[0]: " ".join(words[1:]) for header, lines in config_sections(config) if header == ["global"]
            for words in lines}


def busy_polling_cores(config, container):
    """Errors where haproxy.cfg has busy-polling but its threads would not each have a core
    of their own: a spinning thread keeps its CPU busy, and on a shared one it takes turns
    with everything else. The container's CPU request must equal its limit, be whole, and
    equal nbthread."""
    settings = global_settings(config)
    if "busy-polling" not in settings:
        return []
    if not settings.get("nbthread", "").isdigit():
        return ["HAProxy: haproxy.cfg has busy-polling without nbthread (placement.py haproxy --threads N "
                "--busy-poll, N the container's CPUs)"]
    threads = int(settings["nbthread"])
    resources = container.get("resources", {})
    limit = resources.get("limits", {}).get("cpu")
    # A request left out is the limit (as the API server defaults it).
    request = resources.get("requests", {}).get("cpu", limit)
    if limit is None or cpu_count(request) != threads or cpu_count(limit) != threads:
        return [f"HAProxy: haproxy.cfg has busy-polling and nbthread {threads}, so its container needs a cpu "
                f"request and limit of {threads} whole CPUs (a core of its own for each spinning thread), not "
                f"request {request} and limit {limit}"]
    return []


def haproxy_backends(config):
    """{backend: its server lines' "NAME ADDRESS"} of an HAProxy configuration."""
    return {header[1]: [" ".join(words[1:3]) for words in lines if words[0] == "server"]
            for header, lines in config_sections(config) if header[0] == "backend" and len(header) > 1}


def secret_path(pod, container, secret, key):
    """Where `container` sees `key` of the Secret named `secret`, or None."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        source = volumes.get(m["name"], {}).get("secret", {})
        if source.get("secretName") == secret:
            items = {i["key"]: i["path"] for i in source.get("items", [])}
            if key in items or not items:
                return os.path.join(m["mountPath"], items.get(key, key))
    return None


def validate_sharded(objects, gpu, run_haproxy=True):
    """A StatefulSet of servers behind HAProxy, each server holding the tenants the
    placement table gives it (deploy/placement.py, docs/operations.md "Scaling out")."""
    sets, deployments = objects_of(objects, "StatefulSet"), objects_of(objects, "Deployment")
    if len(sets) != 1 or len(deployments) != 1:
        return [f"expected one StatefulSet (servers) and one Deployment (HAProxy), got {len(sets)} and "
                f"{len(deployments)}"]
    errors = labelled(objects)
    sts, proxy = sets[0], deployments[0]
    errors += check_workload(sts, gpu) + check_workload(proxy, gpu=False, scraped=False)
    errors += check_services(objects)
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    namespace = sts["metadata"].get("namespace", "default")
    replicas = spec.get("replicas", 1)
    if spec.get("podManagementPolicy") != "Parallel":
        errors.append("StatefulSet: podManagementPolicy must be Parallel (replicas hold different tenants)")
    if not isinstance(proxy["spec"].get("replicas"), int) or proxy["spec"]["replicas"] < 2:
        errors.append("HAProxy Deployment: at least two replicas")
    for w in (sts, proxy):
        if not spread_over_hosts(w):
            errors.append(f"{w['kind']} {w['metadata']['name']}: no topologySpreadConstraint over "
                          "kubernetes.io/hostname selecting its pods")
    errors += exclusive_cores(proxy)
    services = {s["metadata"]["name"]: s for s in objects_of(objects, "Service")}
    headless = services.get(spec.get("serviceName"), {}).get("spec", {})
    if headless.get("clusterIP") != "None" or headless.get("publishNotReadyAddresses") is not True:
        errors.append(f"Service {spec.get('serviceName')} (the StatefulSet's serviceName): must be headless "
                      "(clusterIP None) with publishNotReadyAddresses")
    if not any(selects(s["spec"].get("selector", {}), proxy) for s in services.values()):
        errors.append("no Service selects the HAProxy pods")
    budgets = objects_of(objects, "PodDisruptionBudget")
    if not any(selects(b["spec"].get("selector", {}).get("matchLabels", {}), sts) for b in budgets):
        errors.append("no PodDisruptionBudget selects the servers")

    flag_errors, flags = server_flags(objects, pod)
    errors += flag_errors + check_authentication(flags, pod)
    server = pod["containers"][0]
    grpc_port = {p.get("name"): p["containerPort"] for p in server.get("ports", [])}.get("grpc")
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in server.get("env", [])}
    if flag(flags, "replica-name") != "$(POD_NAME)" or env.get("POD_NAME") != "metadata.name":
        errors.append("container server: --replica-name=$(POD_NAME) with POD_NAME from the pod's metadata.name")
    template = f"{{replica}}.{spec.get('serviceName')}.{namespace}.svc.cluster.local:{grpc_port}"
    if flag(flags, "replica-address-template") != template:
        errors.append(f"container server: --replica-address-template={flag(flags, 'replica-address-template')}, "
                      f"not {template} (the headless Service in namespace {namespace})")
    claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    persist = flag(flags, "persist-dir") or ""
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in server.get("volumeMounts", [])}
    if not any(persist.startswith(path + "/") and name in claims for path, name in mounts.items()):
        errors.append(f"container server: --persist-dir={persist} is not on a volumeClaimTemplate's volume")
    if not flag(flags, "snapshot-interval"):
        errors.append("container server: no --snapshot-interval (a crash would lose every named buffer "
                      "since the start)")
    for name in ("tls-cert", "tls-key"):
        if not flag(flags, name) or mounted(pod, server, flag(flags, name), "secret")[0] is None:
            errors.append(f"container server: --{name} must name a file of a mounted Secret")
    return errors + check_placement(objects, sts, proxy, flags, grpc_port, run_haproxy)


def check_placement(objects, sts, proxy, flags, grpc_port, run_haproxy):
    """The table names existing pods, HAProxy's backends are the pods, and haproxy.cfg is
    what placement.py writes for them."""
    errors = []
    pod, proxy_pod = sts["spec"]["template"]["spec"], proxy["spec"]["template"]["spec"]
    server, haproxy = pod["containers"][0], proxy_pod["containers"][0]
    config_maps = {o["metadata"]["name"]: o for o in objects_of(objects, "ConfigMap")}
    placement_file = flag(flags, "placement-file") or ""
    volume, mount = mounted(pod, server, placement_file, "configMap")
    if volume is None or mount.get("subPath"):
        return errors + [f"container server: --placement-file={placement_file} is not in a mounted ConfigMap "
                         "directory (a subPath mount is never updated)"]
    table_map = config_maps.get(volume["configMap"]["name"], {})
    table_text = table_map.get("data", {}).get(os.path.basename(placement_file))
    if table_text is None:
        return errors + [f"ConfigMap {volume['configMap']['name']}: no key {os.path.basename(placement_file)}"]
    table = placement.Table(f"ConfigMap {table_map['metadata']['name']}", table_text)
    pods = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"].get("replicas", 1))]
    errors += table.problems
    for tenant, (replica, index) in table.rows.items():
        if replica not in pods:
            errors.append(f"placement, line {index + 1}: tenant {tenant} is placed on {replica}, which is no "
                          f"pod of the StatefulSet ({', '.join(pods)})")

    # HAProxy: its configuration file, the same table, the TLS material and the ports.
    command = haproxy.get("command", []) + haproxy.get("args", [])
    config_path = command[command.index("-f") + 1] if "-f" in command[:-1] else ""
    volume, _ = mounted(proxy_pod, haproxy, config_path, "configMap")
    config = config_maps.get((volume or {}).get("configMap", {}).get("name"), {}).get("data", {}).get(
        os.path.basename(config_path))
    if config is None:
        return errors + [f"HAProxy: -f {config_path} is not a key of a mounted ConfigMap"]
    map_paths = set(re.findall(r"map_str\(([^)]*)\)", config))
    table_volume = {v["name"] for v in proxy_pod.get("volumes", [])
                    if v.get("configMap", {}).get("name") == table_map["metadata"]["name"]}
    map_path = next((os.path.join(m["mountPath"], os.path.basename(placement_file))
                     for m in haproxy.get("volumeMounts", []) if m["name"] in table_volume and not m.get("subPath")),
                    None)
    if map_paths != {map_path}:
        errors.append(f"HAProxy: its map {sorted(map_paths)} is not the servers' placement table as mounted "
                      f"in its container ({map_path})")
    addresses = {p: f"{p}.{sts['spec']['serviceName']}.{sts['metadata'].get('namespace', 'default')}"
                    f".svc.cluster.local:{grpc_port}" for p in pods}
    backends = haproxy_backends(config)
    backends.pop("placement:unknown-replica", None)
    backends.pop("sni:unknown-replica", None)
    expected = {name: [f"{p} {a}"] for p, a in addresses.items() for name in (p, f"sni:{p}")}
    if backends != expected:
        errors.append(f"HAProxy: backends {backends} are not the StatefulSet's pods {expected}")
    ports = {p.get("name"): p["containerPort"] for p in haproxy.get("ports", [])}
    errors += check_sni_route(objects, proxy, ports, config, table)
    errors += busy_polling_cores(config, haproxy)
    tls_secret = next((v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v and
                       mounted(pod, server, flag(flags, "tls-cert") or "", "secret")[0] is v), None)
    # As docs/operations.md generates it: a thread on each of the proxy's exclusive CPUs,
    # busy-polling.
    threads = cpu_count(haproxy.get("resources", {}).get("limits", {}).get("cpu", 0))
    try:
        generated = placement.haproxy_config(
            list(addresses.items()), map_path or "", f":{ports.get('grpc')}",
            secret_path(proxy_pod, haproxy, tls_secret, "tls.crt"), secret_path(proxy_pod, haproxy, tls_secret, "ca.crt"),
            f":{probe_ports(haproxy.get('livenessProbe', {}))}", f":{ports.get('grpc-sni')}", sni_suffix(config),
            threads, busy_poll=True)
    except placement.Error as e:
        generated = f"placement.py haproxy refused: {e}"
    if config != generated:
        errors.append("HAProxy: the committed haproxy.cfg is not what `deploy/placement.py haproxy` writes for "
                      "the StatefulSet's pods and the proxy's mounts (docs/operations.md, \"Scaling out\")")
    return errors + (check_haproxy(config, table_text) if run_haproxy else [])


def sni_suffix(config):
    """The suffix of the SNI route's server names in an HAProxy configuration, or None."""
    match = re.search(r"^    acl sni_tenant \S+ -m reg \S*?\)\?\[\.\](\S+)\$$", config, re.MULTILINE)
    return match.group(1).replace("[.]", ".") if match else None


def check_sni_route(objects, proxy, ports, config, table):
    """The TLS-passthrough route: a container port grpc-sni that a Service publishes and
    the configuration listens on, and tenants it can name."""
    suffix = sni_suffix(config)
    if "grpc-sni" not in ports or suffix is None:
        return ["HAProxy: no SNI route (a container port grpc-sni and placement.py haproxy --sni-listen on it)"]
    errors = placement.sni_problems(table, suffix)
    if not any(selects(s["spec"].get("selector", {}), proxy) and
               any(p.get("targetPort") in ("grpc-sni", ports["grpc-sni"]) for p in s["spec"]["ports"])
               for s in objects_of(objects, "Service")):
        errors.append("no Service publishes HAProxy's port grpc-sni (the SNI route)")
    return errors


def check_haproxy(config, table_text):
    """`haproxy -c` of the rendered configuration, its files put in a temporary directory."""
    haproxy = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if haproxy is None:
        print("haproxy: not checked (haproxy is not installed; deploy/install-deps.sh installs it)")
        return []
    tls = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testdata", "tls")
    with tempfile.TemporaryDirectory() as work:
        files = {os.path.basename(p): p for p in re.findall(r"map_str\(([^)]*)\)", config)}
        for name, path in files.items():
            with open(os.path.join(work, name), "w") as f:
                f.write(table_text)
            config = config.replace(path, os.path.join(work, name))
        for option, source in (("crt", "server.pem"), ("ca-file", "ca.pem")):
            for path in set(re.findall(rf"\s{option} (\S+)", config)):
                shutil.copy(os.path.join(tls, source), os.path.join(work, os.path.basename(path)))
                if option == "crt":
                    shutil.copy(os.path.join(tls, "server.key"), os.path.join(work, os.path.basename(path) + ".key"))
                config = config.replace(path, os.path.join(work, os.path.basename(path)))
        with open(os.path.join(work, "haproxy.cfg"), "w") as f:
            f.write(config)
        result = subprocess.run([haproxy, "-c", "-f", os.path.join(work, "haproxy.cfg")],
                                capture_output=True, text=True)
    output = result.stdout + result.stderr
    # The replicas' names resolve in the cluster only; the proxy starts without them.
    problems = [line for line in output.splitlines() if ("[ALERT]" in line or "[WARNING]" in line)
                and "could not resolve address" not in line]
    if result.returncode != 0 or problems:
        return [f"haproxy -c: {line}" for line in problems] or [f"haproxy -c failed:\n{output}"]
    print("haproxy -c: ok")
    return []


def kustomize(kubectl, directory):
    result = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {result.stderr.strip()}")
    return [o for o in yaml.safe_load_all(result.stdout) if o]


BROKEN = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: broken
  annotations:
    prometheus.io/port: 9464
spec:
  replica: 1
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - image: gpucompute
          ports: [{containerPort: "50051"}]
          startupProbe: {grpc: {port: 50051, servce: x}}
"""


def self_test():
    """The checks must catch a manifest with known mistakes."""
    errors = validate_schema(yaml.safe_load(BROKEN))
    expected = ["metadata.annotations.prometheus.io/port", "spec.replica", "containerPort", "servce"]
    missed = [e for e in expected if not any(e in error for error in errors)]
    required = validate_schema(yaml.safe_load(BROKEN.replace("replica: 1", "replicas: 1")
                                              .replace("port: 9464", "port: '9464'")
                                              .replace('"50051"', "50051").replace(", servce: x", "")))
    if not any("name" in e for e in required):
        missed.append("the container's missing name")
    return [f"self-test: the checks missed {m} in a broken manifest" for m in missed]


def mutations_caught(objects, gpu):
    """Self-test of the sharded checks: each mistake made in a copy of the rendered
    overlay must be reported."""
    def find(copy, kind, name=None):
        return next(o for o in copy if o["kind"] == kind and (name is None or o["metadata"]["name"] == name))

    def one_replica(copy):
        find(copy, "StatefulSet")["spec"]["replicas"] = 1

    def unknown_row(copy):
        find(copy, "ConfigMap", "gpucompute-placement")["data"]["placement"] += "zed gpucompute-9\n"

    def not_published(copy):
        find(copy, "Service", "gpucompute-replicas")["spec"]["publishNotReadyAddresses"] = False

    def no_tokens(copy):
        server = find(copy, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
        server["args"] = [a for a in server["args"] if not a.startswith("--tokens-file=")]

    def sni_unpublished(copy):
        service = find(copy, "Service", "gpucompute")
        service["spec"]["ports"] = [p for p in service["spec"]["ports"] if p["name"] != "grpc-sni"]

    def sni_unreachable_tenant(copy):
        find(copy, "ConfigMap", "gpucompute-placement")["data"]["placement"] += "Team_C gpucompute-0\n"

    def proxy_burstable(copy):
        resources = find(copy, "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
        resources["requests"]["cpu"] = "1500m"
        resources["limits"].pop("cpu", None)

    def haproxy_config(copy):
        return next(o for o in copy if o["kind"] == "ConfigMap" and
                    o["metadata"]["name"].startswith("gpucompute-haproxy"))["data"]

    def proxy_fewer_cpus(copy):
        resources = find(copy, "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
        resources["requests"]["cpu"] = resources["limits"]["cpu"] = "2"

    def more_threads_than_cpus(copy):
        data = haproxy_config(copy)
        data["haproxy.cfg"] = re.sub(r"(?m)^    nbthread \d+$", "    nbthread 8", data["haproxy.cfg"])

    def busy_polling_without_threads(copy):
        data = haproxy_config(copy)
        data["haproxy.cfg"] = re.sub(r"(?m)^    nbthread \d+\n", "", data["haproxy.cfg"])

    def other_namespace(copy):
        for o in copy:
            o["metadata"]["namespace"] = "elsewhere"

    cases = [
        (one_replica, ["tenant team-b is placed on gpucompute-1, which is no pod", "are not the StatefulSet's pods",
                       "the committed haproxy.cfg"]),
        (unknown_row, ["tenant zed is placed on gpucompute-9"]),
        (not_published, ["publishNotReadyAddresses"]),
        (no_tokens, ["without authentication"]),
        (sni_unpublished, ["no Service publishes HAProxy's port grpc-sni"]),
        (sni_unreachable_tenant, ["tenant Team_C is not a DNS label"]),
        (other_namespace, ["--replica-address-template", "are not the StatefulSet's pods"]),
        (proxy_burstable, ["cpu request 1500m and limit none must be equal"]),
        (proxy_fewer_cpus, ["haproxy.cfg has busy-polling and nbthread 4, so its container needs a cpu request "
                            "and limit of 4 whole CPUs (a core of its own for each spinning thread), not "
                            "request 2 and limit 2", "the committed haproxy.cfg"]),
        (more_threads_than_cpus, ["busy-polling and nbthread 8, so its container needs a cpu request and limit "
                                  "of 8 whole CPUs", "the committed haproxy.cfg"]),
        (busy_polling_without_threads, ["haproxy.cfg has busy-polling without nbthread"]),
    ]
    missed = []
    for mutate, expected in cases:
        copy = copy_module.deepcopy(objects)
        mutate(copy)
        errors = validate_sharded(copy, gpu, run_haproxy=False)
        missed += [f"self-test: {mutate.__name__}: no error '{e}'" for e in expected
                   if not any(e in error for error in errors)]
    return missed


def check_compose(path):
    """docker-compose's schema check of the compose file, and of a broken one."""
    compose = shutil.which("docker-compose")
    if compose is None:
        print("compose: not checked (docker-compose is not installed)")
        return []

    def config(file):
        return subprocess.run([compose, "-f", os.path.abspath(file), "config", "-q"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(file)))

    failures = []
    result = config(path)
    print(f"compose: {'ok' if result.returncode == 0 else 'problems'}")
    if result.returncode != 0:
        failures.append(f"docker-compose config: {result.stderr.strip()}")
    with open(path) as f:
        broken = f.read().replace("read_only:", "read_onyl:")
    with tempfile.TemporaryDirectory() as work:
        broken_path = os.path.join(work, "compose.yaml")
        with open(broken_path, "w") as f:
            f.write(broken)
        if config(broken_path).returncode == 0:
            failures.append("self-test: docker-compose accepted a compose file with a misspelt key")
    return failures


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    deploy = sys.argv[1]
    global placement
    sys.path.insert(0, os.path.abspath(deploy))
    placement = importlib.import_module("placement")
    kubectl = shutil.which("kubectl")
    yamllint = shutil.which("yamllint")
    if kubectl is None:
        skip("kubectl is not installed (Debian's kubernetes-client; deploy/install-deps.sh installs it)")
    if yamllint is None:
        skip("yamllint is not installed (deploy/install-deps.sh installs it)")
    failures = self_test()
    overlays = os.path.join(deploy, "kubernetes", "overlays")
    names = sorted(os.listdir(overlays))
    if not names:
        failures.append(f"no overlays in {overlays}")
    for name in names:
        try:
            objects = kustomize(kubectl, os.path.join(overlays, name))
        except RuntimeError as e:
            failures.append(str(e))
            continue
        errors = [e for o in objects for e in validate_schema(o)]
        if not errors:
            gpu = name.split("-")[0] == "gpu"
            sharded = any(o["kind"] == "StatefulSet" for o in objects)
            errors = validate_sharded(objects, gpu) if sharded else validate_policy(objects, gpu)
            if sharded and not errors:
                errors = mutations_caught(objects, gpu)
        print(f"overlay {name}: {len(objects)} objects, {'ok' if not errors else f'{len(errors)} problems'}")
        failures += [f"overlay {name}: {e}" for e in errors]
    lint = subprocess.run([yamllint, "-s", "-c", os.path.join(deploy, "yamllint.yaml"),
                           os.path.join(deploy, "kubernetes"), os.path.join(deploy, "compose.yaml")],
                          capture_output=True, text=True)
    print(f"yamllint: {'ok' if lint.returncode == 0 else 'problems'}")
    if lint.returncode != 0:
        failures.append(f"yamllint:\n{lint.stdout}{lint.stderr}")
    failures += check_compose(os.path.join(deploy, "compose.yaml"))
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
