"""Kubernetes manifests for a job's workers (``regency kubernetes``; docs/jobs.md).

Per mesh: a headless Service and a StatefulSet whose pods each run
``run_worker_loop_forever`` at their stable DNS name
(``{job}-{mesh}-{i}.{job}-{mesh}.{namespace}.svc.cluster.local``). The job secret comes from
a Kubernetes Secret the user creates (it is never written into the manifests).
"""

from __future__ import annotations

import json

from ._local import check_meshes

_WORKER = (
    "import os; from regency.actor import run_worker_loop_forever; "
    "run_worker_loop_forever(address='tcp://%s.{service}.{namespace}.svc.cluster.local:{port}' "
    "% os.environ['POD_NAME'], ca='trust_all_connections')"
)


def _check_name(value: str, what: str) -> str:
    ok = (
        isinstance(value, str)
        and 0 < len(value) <= 40
        and value[0].isalpha()
        and all(c.islower() or c.isdigit() or c == "-" for c in value)
    )
    if not ok:
        raise ValueError(
            f"{what} must be a DNS label: lower-case letters, digits and '-', starting with a "
            f"letter, at most 40 characters (got {value!r})"
        )
    return value


def _service(job_name: str, mesh: str) -> str:
    return _check_name(f"{job_name}-{mesh.replace('_', '-')}".lower(), "job_name-mesh")


def kubernetes_worker_addresses(
    meshes: dict[str, int], *, job_name: str = "regency", namespace: str = "default",
    port: int = 7700,
) -> dict[str, list[str]]:  # fmt: skip
    """The worker addresses of each mesh, for ``attach_to_workers`` in the controller pod."""
    meshes = check_meshes(meshes, "kubernetes_worker_addresses")
    _check_name(job_name, "job_name")
    _check_name(namespace, "namespace")
    out = {}
    for mesh, count in meshes.items():
        service = _service(job_name, mesh)
        out[mesh] = [
            f"tcp://{service}-{i}.{service}.{namespace}.svc.cluster.local:{port}"
            for i in range(count)
        ]
    return out


def kubernetes_manifests(
    meshes: dict[str, int],
    image: str,
    *,
    job_name: str = "regency",
    namespace: str = "default",
    port: int = 7700,
    python_exe: str = "python",
    secret_name: str = "regency-job-secret",
    gpus_per_host: int | None = None,
) -> str:
    """YAML (several documents) for ``kubectl apply -f -``: a headless Service and a
    StatefulSet per mesh. Create the secret first:
    ``kubectl create secret generic regency-job-secret --from-literal=secret=$(openssl rand -hex 24)``.
    """
    meshes = check_meshes(meshes, "kubernetes_manifests")
    _check_name(job_name, "job_name")
    _check_name(namespace, "namespace")
    _check_name(secret_name, "secret_name")
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise ValueError(f"image must name a container image, e.g. 'ghcr.io/me/train:1' (got {image!r})")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"port must be an int in 1..65535 (got {port!r})")
    if gpus_per_host is not None and (
        not isinstance(gpus_per_host, int) or isinstance(gpus_per_host, bool) or gpus_per_host < 1
    ):
        raise ValueError(f"gpus_per_host must be a positive int or None (got {gpus_per_host!r})")
    q = json.dumps  # JSON scalars are YAML scalars: quoting done right
    docs = []
    for mesh, count in meshes.items():
        service = _service(job_name, mesh)
        labels = f"{{app.kubernetes.io/name: regency, regency/job: {q(job_name)}, regency/mesh: {q(service)}}}"
        worker = _WORKER.format(service=service, namespace=namespace, port=port)
        resources = (
            f"\n          resources: {{limits: {{nvidia.com/gpu: {gpus_per_host}}}}}"
            if gpus_per_host is not None
            else ""
        )
        docs.append(
            f"""apiVersion: v1
kind: Service
metadata:
  name: {q(service)}
  namespace: {q(namespace)}
  labels: {labels}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {labels}
  ports: [{{name: regency, port: {port}}}]"""
        )
        docs.append(
            f"""apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {q(service)}
  namespace: {q(namespace)}
  labels: {labels}
spec:
  serviceName: {q(service)}
  replicas: {count}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {labels}
  template:
    metadata:
      labels: {labels}
    spec:
      containers:
        - name: worker
          image: {q(image)}
          command: [{q(python_exe)}, "-c", {q(worker)}]
          ports: [{{containerPort: {port}, name: regency}}]
          env:
            - name: POD_NAME
              valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
            - name: REGENCY_SECRET
              valueFrom: {{secretKeyRef: {{name: {q(secret_name)}, key: secret}}}}{resources}"""
        )
    return "---\n" + "\n---\n".join(docs) + "\n"
