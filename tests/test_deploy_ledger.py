"""The deploy recipes keep the spend ledger in PostgreSQL, checked offline: compose runs a postgres
service both gateways write to; Kubernetes runs a StatefulSet on a PersistentVolume (or a managed
database) whose URL reaches the pods from a Secret, and only the gateways may connect to it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.ledger import open_database
from gateway.ledger.postgres import PostgresLedger
from tests.test_deploy_gateway import (
    COMPOSE,
    container_env,
    environment,
    gateway_deployment,
    main_container,
    manifest_files,
    named,
    objects,
    of_command,
    pod_spec,
    selects,
    services,
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_compose_gateways_write_one_postgres_ledger(compose: dict[str, Any]) -> None:
    postgres = services(compose)["postgres"]
    assert postgres["image"].startswith("postgres:") and postgres["healthcheck"]["test"][1] == "pg_isready"
    database = environment(postgres)
    (volume,) = postgres["volumes"]
    assert volume.split(":")[0] in compose["volumes"], "the data outlives the container"
    for name, gateway in of_command(compose, "serve").items():
        url = environment(gateway)["GATEWAY_LEDGER"]
        parts = urlsplit(url)
        assert parts.scheme == "postgresql" and parts.hostname == "postgres" and parts.port == 5432, name
        assert (parts.username, parts.password, parts.path) == (
            database["POSTGRES_USER"],
            database["POSTGRES_PASSWORD"],
            "/" + database["POSTGRES_DB"],
        ), name
        assert gateway["depends_on"]["postgres"]["condition"] == "service_healthy", name
        ledger = open_database(url)
        assert isinstance(ledger, PostgresLedger) and database["POSTGRES_PASSWORD"] not in ledger.location


def test_kubernetes_gateways_take_the_ledger_url_from_a_secret(k8s: list[dict[str, Any]]) -> None:
    env = container_env(main_container(gateway_deployment(k8s)))
    ref = env["GATEWAY_LEDGER"]["valueFrom"]["secretKeyRef"]
    secret = named(k8s, "Secret", ref["name"])
    assert ref["key"] in secret["stringData"] and not ref.get("optional"), "no silent per-pod ledger"
    assert all(value == "" for value in secret["stringData"].values()), "the template holds no secret"
    assert env["GATEWAY_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_kubernetes_postgres_is_a_statefulset_on_a_persistent_volume(k8s: list[dict[str, Any]]) -> None:
    postgres = named(k8s, "StatefulSet", "postgres")
    assert postgres["spec"]["replicas"] == 1
    container = main_container(postgres)
    (data,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/postgresql/data"]
    claims = {c["metadata"]["name"]: c for c in postgres["spec"]["volumeClaimTemplates"]}
    assert data["name"] in claims and data["name"] not in {v["name"] for v in pod_spec(postgres)["volumes"]}
    password = container_env(container)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    ledger_ref = container_env(main_container(gateway_deployment(k8s)))["GATEWAY_LEDGER"]["valueFrom"]
    assert password["name"] == ledger_ref["secretKeyRef"]["name"], (
        "one Secret holds the database's credentials"
    )
    service = named(k8s, "Service", postgres["spec"]["serviceName"])
    assert selects(service["spec"]["selector"], postgres["spec"]["template"]["metadata"]["labels"])
    assert [p["port"] for p in service["spec"]["ports"]] == [5432]


def test_only_the_gateways_reach_the_ledger_database(k8s: list[dict[str, Any]]) -> None:
    postgres_labels = named(k8s, "StatefulSet", "postgres")["spec"]["template"]["metadata"]["labels"]
    gateway_labels = gateway_deployment(k8s)["spec"]["template"]["metadata"]["labels"]
    guards = [
        n
        for n in objects(k8s, "NetworkPolicy")
        if selects(n["spec"]["podSelector"]["matchLabels"], postgres_labels)
    ]
    sources = [peer for guard in guards for rule in guard["spec"]["ingress"] for peer in rule["from"]]
    assert guards and sources
    assert all(selects(peer["podSelector"]["matchLabels"], gateway_labels) for peer in sources)
