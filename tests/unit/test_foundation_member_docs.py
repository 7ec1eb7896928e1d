"""`skyfed submit` routes `kind: Cluster|Site` documents to the registration endpoints."""

from __future__ import annotations

import pytest
import typer

from broker.commands.core import _member_document


def test_cluster_and_site_documents_become_registration_bodies() -> None:
    doc = {"apiVersion": "skyfed.io/v1", "kind": "Cluster", "metadata": {"name": "aws-use1"},
           "spec": {"provider": "aws", "region": "us-east-1", "pools": []}}
    assert _member_document(doc) == ("clusters", {"name": "aws-use1", "provider": "aws",
                                                  "region": "us-east-1", "pools": []})
    site = {"kind": "Site", "metadata": {"name": "edge-1"}, "spec": {"lat": 1.0, "lon": 2.0}}
    assert _member_document(site) == ("sites", {"name": "edge-1", "lat": 1.0, "lon": 2.0})


def test_workloads_are_left_alone_and_bad_members_fail_clearly(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _member_document({"kind": "Workload", "spec": {}}) is None
    with pytest.raises(typer.Exit) as exc:
        _member_document({"kind": "Cluster", "spec": {"provider": "aws"}})
    assert exc.value.exit_code == 1
    assert "Cluster document needs metadata.name" in capsys.readouterr().err
