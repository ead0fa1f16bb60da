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
- yamllint checks the sources (deploy/kubernetes, deploy/compose.yaml), and
  docker-compose (where installed) checks deploy/compose.yaml against the Compose schema.
- A deliberately broken manifest must be rejected, so the checks themselves are tested.

Usage: kubernetes_manifests_test.py DEPLOY_DIR. Exit 0 when all pass, 1 on failures,
77 (skipped) when kubectl, yamllint or python3-kubernetes is missing.
"""
import os
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
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c and probe_ports(c[probe]) not in ports.values():
                errors.append(f"{where}: {probe} probes a port the container does not expose")
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
            errors = validate_policy(objects, gpu=(name == "gpu"))
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
