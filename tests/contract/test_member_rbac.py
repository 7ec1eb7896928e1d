"""deploy/member-rbac.yaml: valid Kubernetes objects, bound to one service account, and the
check that holds the driver's calls to it (tests/contract/rbac.py) refuses what it should.
Which calls it must grant is checked where the calls are made: every kmock fixture of the
driver's contract suite and integration tests asserts `denied(...) == []` on teardown."""

from __future__ import annotations

import yaml

from tests.contract.rbac import RBAC_FILE, denied, parse
from tests.integration.test_deploy_helm import k8s_round_trip


def test_every_object_round_trips_through_kubernetes_models() -> None:
    docs = [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d]
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "ClusterRole",
                                         "ClusterRoleBinding", "Role", "RoleBinding"]
    for doc in docs:
        assert k8s_round_trip(doc) == doc  # a misspelt key does not survive the models
    bindings = [d for d in docs if d["kind"].endswith("Binding")]
    assert {(s["kind"], s["name"], s["namespace"]) for b in bindings for s in b["subjects"]} \
        == {("ServiceAccount", "skyfed-broker", "skyfed")}


def test_the_check_refuses_what_a_real_api_server_would() -> None:
    allowed = [parse("GET", "/api/v1/pods", {"fieldSelector": "status.phase!=Succeeded"}),
               parse("PATCH", "/apis/apps/v1/namespaces/skyfed/statefulsets/skyfed-w-1", {}),
               parse("GET", "/apis/batch/v1/namespaces/skyfed/jobs", {"watch": "true"}),
               parse("PATCH", "/api/v1/namespaces/skyfed", {})]
    assert denied(allowed) == []
    refused = [parse("GET", "/api/v1/namespaces/kube-system/secrets/admin", {}),  # other ns
               parse("PATCH", "/api/v1/nodes/n1", {}),  # nodes are read-only
               parse("PATCH", "/api/v1/namespaces/kube-system", {}),  # only its own namespace
               parse("DELETE", "/apis/apps/v1/namespaces/skyfed/deployments", {}),  # collection
               parse("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {})]
    assert denied(refused) == sorted(str(c) for c in refused)
    # Moved to another namespace as the file's header says, it grants there and not here.
    moved = parse("PATCH", "/apis/apps/v1/namespaces/team-a/deployments/skyfed-w-1", {})
    assert denied([moved], namespace="team-a") == []
    assert denied([allowed[1]], namespace="team-a") == [str(allowed[1])]
