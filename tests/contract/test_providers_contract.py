"""One contract suite, run against every CloudProvider adapter over real HTTP.

AWS talks to moto's server on loopback (stateful: scale_pool really creates and terminates
instances); GCE and Azure talk to libcloud's own recorded fixtures served by
tests/contract/fixture_server.py (stateless replays, plus injected error codes).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from providers.base import Capability, CloudProvider
from providers.cloud import client_token
from providers.errors import (
    AuthError,
    ConfigError,
    ConflictError,
    NotFoundError,
    ProviderError,
    ThrottledError,
    TransientError,
)
from tests.contract.fixture_server import FixtureState, serve

SECRET = "s3cr3t-never-logged"
AZ_TENANT = "77777777-7777-7777-7777-777777777777"


@dataclass
class Ctx:
    provider: CloudProvider
    region: str
    inject: Callable[[int], None] | None  # make the next request answer this HTTP status
    state: FixtureState | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    try:
        yield port
    finally:
        srv.stop()


def _aws(moto_port: int, **kw: object) -> CloudProvider:
    from providers.aws import AwsOptions, AwsProvider

    opts = AwsOptions("AKIDCONTRACT", SECRET, endpoint_host="127.0.0.1", endpoint_port=moto_port,
                      secure=False, timeout_s=10, **kw)  # type: ignore[arg-type]
    return AwsProvider(opts)


def _gcp(port: int, tmp: Path) -> CloudProvider:
    from providers.gcp import GcpOptions, GcpProvider

    token = tmp / "gce-token.json"
    token.write_text(json.dumps({"access_token": "t", "token_type": "Bearer",
                                 "expire_time": "2100-01-01T00:00:00Z"}))
    return GcpProvider(GcpOptions(
        project="project_name", client_email="sa@project_name.iam", key=SECRET, auth_type="IA",
        credential_file=str(token), image="debian-7-wheezy-v20131120",
        endpoint_host="127.0.0.1", endpoint_port=port, secure=False, timeout_s=10,
    ))


def _azure(port: int) -> CloudProvider:
    from providers.azure import AzureOptions, AzureProvider

    url = f"http://127.0.0.1:{port}/"
    return AzureProvider(AzureOptions(
        tenant_id=AZ_TENANT, subscription_id="99999999", client_id="cid", client_secret=SECRET,
        cloud_environment={"resourceManagerEndpointUrl": url, "activeDirectoryEndpointUrl": url,
                           "activeDirectoryResourceId": url, "storageEndpointSuffix": "local"},
        endpoint_port=port, secure=False, login_port=port, timeout_s=10,
        retail_prices_url=f"{url}api/retail/prices",
    ))


def azure_retail_item(sku: str, price: float, *, spot: bool = False,
                      windows: bool = False) -> dict[str, object]:
    """One item of the documented Azure Retail Prices API response (learn.microsoft.com
    /rest/api/cost-management/retail-prices/azure-retail-prices)."""
    meter = sku.removeprefix("Standard_").replace("_", " ") + (" Spot" if spot else "")
    return {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price,
            "unitPrice": price, "armRegionName": "eastus", "location": "US East",
            "effectiveStartDate": "2024-01-01T00:00:00Z", "meterName": meter,
            "productName": "Virtual Machines A Series" + (" Windows" if windows else ""),
            "skuName": meter, "serviceName": "Virtual Machines", "serviceFamily": "Compute",
            "unitOfMeasure": "1 Hour", "type": "Consumption", "isPrimaryMeterRegion": True,
            "armSkuName": sku}


def azure_retail_prices(items: list[dict[str, object]]) -> dict[str, object]:
    return {"BillingCurrency": "USD", "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail", "Items": items, "NextPageLink": None,
            "Count": len(items)}


# Documented response shape of Azure "Usage - List" (libcloud has no recording of it).
AZURE_USAGES = {"value": [
    {"currentValue": 4, "limit": 100, "name": {"value": "cores"}, "unit": "Count"},
    {"currentValue": 2, "limit": 25000, "name": {"value": "virtualMachines"}, "unit": "Count"},
    {"currentValue": 0, "limit": 24, "name": {"value": "standardNCADSA100v4Family"},
     "unit": "Count"},
]}


@pytest.fixture(params=["aws", "gcp", "azure"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ctx]:
    name = request.param
    if name == "aws":
        port = request.getfixturevalue("moto_port")
        yield Ctx(_aws(port), "us-east-1", None)
        return
    state = FixtureState("gce" if name == "gcp" else "azure_arm")
    with serve(state) as port:
        if name == "gcp":
            yield Ctx(_gcp(port, tmp_path), "us-central1", state.faults.append, state)
        else:
            state.extra[f"/{AZ_TENANT}/oauth2/token"] = {
                "access_token": "t", "token_type": "Bearer", "expires_on": "4102444800"}
            state.extra["/subscriptions/99999999/providers/Microsoft.Compute/locations/"
                        "eastus/usages"] = AZURE_USAGES
            state.extra["/api/retail/prices"] = azure_retail_prices([
                azure_retail_item("Standard_A2", 0.09),
                azure_retail_item("Standard_A2", 0.018, spot=True),
                azure_retail_item("Standard_A2", 0.13, windows=True)])
            yield Ctx(_azure(port), "eastus", state.faults.append, state)


def test_is_a_cloud_provider_with_declared_capabilities(ctx: Ctx) -> None:
    assert isinstance(ctx.provider, CloudProvider)
    assert {Capability.LIST_REGIONS, Capability.LIST_OFFERS, Capability.QUOTAS} <= set(
        ctx.provider.capabilities)
    assert SECRET not in repr(ctx.provider)


async def test_list_regions_has_the_region_with_coordinates(ctx: Ctx) -> None:
    regions = {r.name: r for r in await ctx.provider.list_regions()}
    assert ctx.region in regions
    r = regions[ctx.region]
    assert r.provider == ctx.provider.name
    assert r.lat is not None
    assert r.lon is not None


async def test_list_offers_merges_live_sizes_with_catalog(ctx: Ctx) -> None:
    offers = await ctx.provider.list_offers(region=ctx.region)
    assert len(offers) > 20
    assert all(o.region == ctx.region and o.vcpu > 0 and o.memory_gib > 0 for o in offers)
    live = [o for o in offers if o.source == "live"]
    assert live, "no offer came from the API"
    assert any(o.gpu_count > 0 and o.gpu_model for o in offers)
    priced = [o for o in offers if o.price_usd_per_hour is not None]
    assert all(o.price_usd_per_hour > 0 for o in priced)  # type: ignore[operator]
    if ctx.provider.name == "azure":  # live from the Retail Prices API: Linux, and spot
        a2 = next(o for o in offers if o.instance_type == "Standard_A2")
        assert (a2.price_usd_per_hour, a2.spot_price_usd_per_hour) == (0.09, 0.018)


async def test_quotas_have_limits(ctx: Ctx) -> None:
    quotas = await ctx.provider.get_quotas(region=ctx.region)
    metrics = {q.metric: q for q in quotas}
    assert {"vcpu", "instances"} & set(metrics)
    assert all(q.limit >= 0 and q.used >= 0 and q.region == ctx.region for q in quotas)
    assert any(q.limit > 0 for q in quotas)


async def test_unknown_region_is_named(ctx: Ctx) -> None:
    with pytest.raises(NotFoundError) as err:
        await ctx.provider.list_offers(region="mars-1")
    assert "mars-1" in str(err.value)


@pytest.mark.parametrize(("code", "error"), [(429, ThrottledError), (503, TransientError),
                                             (401, AuthError)])
async def test_http_errors_map_into_the_tree(ctx: Ctx, code: int,
                                             error: type[ProviderError]) -> None:
    if ctx.inject is None:
        pytest.skip("moto cannot inject status codes; see test_aws_unreachable_is_transient")
    await ctx.provider.list_regions()  # warm up: auth + driver
    ctx.inject(code)
    with pytest.raises(error) as err:
        await ctx.provider.get_quotas(region=ctx.region)
    assert err.value.retryable is (error in (ThrottledError, TransientError))
    assert SECRET not in str(err.value)


async def test_aws_unreachable_is_transient() -> None:
    p = _aws(_free_port())
    with pytest.raises(TransientError) as err:
        await p.get_quotas(region="us-east-1")
    assert err.value.retryable
    assert SECRET not in str(err.value)


async def test_aws_scale_pool_creates_and_never_terminates(moto_port: int) -> None:
    probe = _aws(moto_port)
    drv = probe._driver("us-east-1")  # type: ignore[attr-defined]
    image = drv.list_images()[0].id
    p = _aws(moto_port, image_id=image, vcpu_limit=128)
    labels = {"skyfed.io/cluster": "c1"}
    assert await p.scale_pool(region="us-east-1", pool="contract", instance_type="m5.large",
                              nodes=3, labels=labels) == 3
    q = {x.metric: x for x in await p.get_quotas(region="us-east-1")}
    assert q["vcpu"].used >= 6  # 3 x m5.large (2 vCPU)
    # A lower count terminates nothing: which machine goes is remove_nodes' choice, by name
    # (an order computed from a stale count must not take a busy node).
    assert await p.scale_pool(region="us-east-1", pool="contract", instance_type="m5.large",
                              nodes=1, labels=labels) == 3
    with pytest.raises(NotFoundError, match=r"x9\.huge"):
        await p.scale_pool(region="us-east-1", pool="contract", instance_type="x9.huge",
                           nodes=1, labels=labels)


async def test_gcp_scale_pool_posts_a_labelled_instance(tmp_path: Path) -> None:
    state = FixtureState("gce")
    with serve(state) as port:
        # the replayed API has no memory: answer the new instance's GET with a recorded node
        from tests.contract.fixture_server import FIXTURES

        state.extra["/compute/v1/projects/project_name/zones/us-central1-a/instances/"
                    "skyfed-gpu-0"] = json.loads(
            (FIXTURES / "gce" / "zones_us-central1-a_instances_node-name.json").read_text())
        p = _gcp(port, tmp_path)
        await p.scale_pool(region="us-central1", pool="gpu", instance_type="n1-standard-1",
                           nodes=1, labels={"skyfed.io/cluster": "c1"})
    assert "POST /compute/v1/projects/project_name/zones/us-central1-a/instances" in state.requests


async def test_gcp_a_retried_order_asks_for_the_same_instance_and_gce_refuses_it(
        tmp_path: Path) -> None:
    """GCE takes no client token: a retried order whose insert GCE accepted before the
    instance showed asks for the same name again (the lowest free one), and GCE answers
    alreadyExists (409), a ConflictError, instead of making a second machine."""
    state = FixtureState("gce")
    path = "/compute/v1/projects/project_name/zones/us-central1-a/instances"
    message = "The resource 'projects/project_name/zones/us-central1-a/instances/skyfed-gpu-0' " \
              "already exists"
    state.extra[f"POST {path}"] = (409, {"error": {"code": 409, "message": message, "errors": [
        {"domain": "global", "reason": "alreadyExists", "message": message}]}})
    with serve(state) as port:
        p = _gcp(port, tmp_path)
        with pytest.raises(ConflictError, match="already exists"):
            await p.scale_pool(region="us-central1", pool="gpu", instance_type="n1-standard-1",
                               nodes=1, labels={"skyfed.io/cluster": "c1"})
    posts = [b for r, b in zip(state.requests, state.bodies, strict=True) if r == f"POST {path}"]
    assert len(posts) == 1
    assert json.loads(posts[0])["name"] == "skyfed-gpu-0"


async def test_aws_remove_nodes_terminates_exactly_the_named_instances(moto_port: int) -> None:
    """A scale-in names the node to go; the node group must lose that machine, not the last
    one by name (which may run work). Named by instance id (an EKS node's providerID tail) or
    private DNS name (an EKS node's name)."""
    import asyncio

    probe = _aws(moto_port)
    drv = probe._driver("us-east-1")  # type: ignore[attr-defined]
    image = drv.list_images()[0].id
    p = _aws(moto_port, image_id=image)
    labels = {"skyfed.io/cluster": "c1"}
    assert await p.scale_pool(region="us-east-1", pool="named", instance_type="m5.large",
                              nodes=3, labels=labels) == 3

    async def pool() -> dict[str, object]:
        nodes = await asyncio.to_thread(drv.list_nodes, ex_filters={
            "tag:skyfed.io/pool": "named", "instance-state-name": ["pending", "running"]})
        return {n.name: n for n in nodes}

    first = await pool()
    assert sorted(first) == ["skyfed-named-0", "skyfed-named-1", "skyfed-named-2"]
    middle = first["skyfed-named-1"].id  # type: ignore[attr-defined]
    assert await p.remove_nodes(region="us-east-1", pool="named", nodes=[middle]) == 2
    assert sorted(await pool()) == ["skyfed-named-0", "skyfed-named-2"]
    # A name no machine of the group has (already gone, or another group's) removes nothing.
    assert await p.remove_nodes(region="us-east-1", pool="named",
                                nodes=[middle, "i-0000000000000000f"]) == 2
    dns = first["skyfed-named-0"].extra["private_dns"]  # type: ignore[attr-defined]
    assert dns
    assert await p.remove_nodes(region="us-east-1", pool="named", nodes=[dns]) == 1
    assert sorted(await pool()) == ["skyfed-named-2"]
    # The next order fills the gaps instead of naming a machine after one still running.
    assert await p.scale_pool(region="us-east-1", pool="named", instance_type="m5.large",
                              nodes=3, labels=labels) == 3
    assert sorted(await pool()) == ["skyfed-named-0", "skyfed-named-1", "skyfed-named-2"]


async def test_aws_two_clusters_node_groups_of_one_name_stay_apart(moto_port: int) -> None:
    """Two clusters in one region and account, each with a pool `cpu` scaled through its
    default group (the pool's name): each counts and removes only its own machines."""
    import asyncio

    probe = _aws(moto_port)
    drv = probe._driver("us-east-1")  # type: ignore[attr-defined]
    p = _aws(moto_port, image_id=drv.list_images()[0].id)
    prod, staging = {"skyfed.io/cluster": "prod"}, {"skyfed.io/cluster": "staging"}
    assert await p.scale_pool(region="us-east-1", pool="cpu-shared", instance_type="m5.large",
                              nodes=2, labels=prod) == 2
    # staging's order is its own: before, it counted prod's two machines and ordered none.
    assert await p.scale_pool(region="us-east-1", pool="cpu-shared", instance_type="m5.large",
                              nodes=1, labels=staging) == 1
    listed = await asyncio.to_thread(drv.list_nodes, ex_filters={
        "tag:skyfed.io/pool": "cpu-shared", "instance-state-name": ["pending", "running"]})
    of = {c: [n.id for n in listed if n.extra["tags"]["skyfed.io/cluster"] == c]
          for c in ("prod", "staging")}
    assert (len(of["prod"]), len(of["staging"])) == (2, 1)
    # A name of prod's machine given for staging's group removes nothing.
    assert await p.remove_nodes(region="us-east-1", pool="cpu-shared", nodes=of["prod"][:1],
                                labels=staging) == 1
    assert await p.remove_nodes(region="us-east-1", pool="cpu-shared", nodes=of["prod"][:1],
                                labels=prod) == 1


async def test_aws_scale_pool_launches_from_the_groups_launch_template(moto_port: int) -> None:
    """A bare instance of an AMI does not join an EKS cluster: its bootstrap user data, its
    instance profile and security groups live in the node group's launch template."""
    import asyncio
    import base64

    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
                       aws_access_key_id="AKIDLT", aws_secret_access_key="secret-lt")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    bootstrap = "#!/bin/bash\n/etc/eks/bootstrap.sh prod\n"
    ec2.create_launch_template(LaunchTemplateName="prod-gpu-ng", LaunchTemplateData={
        "ImageId": image, "UserData": base64.b64encode(bootstrap.encode()).decode(),
        "IamInstanceProfile": {"Name": "eks-node-role"}})
    p = _aws(moto_port, launch_template="{cluster}-{group}")
    labels = {"skyfed.io/cluster": "prod"}
    assert await p.scale_pool(region="us-east-1", pool="gpu-ng", instance_type="g5.xlarge",
                              nodes=2, labels=labels) == 2
    drv = p._driver("us-east-1")  # type: ignore[attr-defined]
    listed = await asyncio.to_thread(drv.list_nodes, ex_filters={
        "tag:skyfed.io/pool": "gpu-ng", "instance-state-name": ["pending", "running"]})
    assert sorted(n.name for n in listed) == ["skyfed-gpu-ng-0", "skyfed-gpu-ng-1"]
    template_id = ec2.describe_launch_templates(
        LaunchTemplateNames=["prod-gpu-ng"])["LaunchTemplates"][0]["LaunchTemplateId"]
    for n in listed:
        assert n.extra["tags"]["aws:ec2launchtemplate:id"] == template_id
        assert n.extra["tags"]["skyfed.io/cluster"] == "prod"
        assert n.extra["instance_type"] == "g5.xlarge"  # the pool's, not the template's
        attr = ec2.describe_instance_attribute(InstanceId=n.id, Attribute="userData")
        assert base64.b64decode(attr["UserData"]["Value"]).decode() == bootstrap
    # A template that names the cluster needs one to name.
    with pytest.raises(ConfigError, match="cluster"):
        await p.scale_pool(region="us-east-1", pool="gpu-ng", instance_type="g5.xlarge",
                           nodes=3, labels={})


def _bare_and_templated(moto_port: int, key: str) -> tuple[Any, CloudProvider, CloudProvider]:
    """A boto3 EC2 client of account `key`, and two AWS adapters on moto: one that launches an
    AMI bare, one that launches from the EC2 launch template `<key>-lt` of that AMI."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
                       aws_access_key_id=f"AKID{key.upper()}",
                       aws_secret_access_key=f"secret-{key}")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(LaunchTemplateName=f"{key}-lt", LaunchTemplateData={
        "ImageId": image})
    return (ec2, _aws(moto_port, image_id=image, vcpu_limit=1000),
            _aws(moto_port, launch_template=f"{key}-lt"))


async def test_aws_scale_pool_launches_each_machine_with_its_orders_client_token(
        moto_port: int) -> None:
    """A retried order whose RunInstances timed out after EC2 had accepted it would launch a
    second machine; with the order's ClientToken for each machine EC2 answers the retry with
    the first. Bare and from a launch template alike; every order and machine its own."""
    ec2, bare, templated = _bare_and_templated(moto_port, "tok")
    labels = {"skyfed.io/cluster": "c-tok"}
    assert await bare.scale_pool(region="us-east-1", pool="tok-bare", instance_type="m5.large",
                                 nodes=2, labels=labels, order="order-1") == 2
    assert await templated.scale_pool(region="us-east-1", pool="tok-lt",
                                      instance_type="m5.large", nodes=1, labels=labels,
                                      order="order-2") == 1

    def tokens(pool: str) -> dict[str, str]:
        out = ec2.describe_instances(Filters=[{"Name": "tag:skyfed.io/pool", "Values": [pool]}])
        return {next(t["Value"] for t in i["Tags"] if t["Key"] == "Name"): i["ClientToken"]
                for r in out["Reservations"] for i in r["Instances"]}

    assert tokens("tok-bare") == {f"skyfed-tok-bare-{i}": client_token("order-1",
                                                                       f"skyfed-tok-bare-{i}")
                                  for i in range(2)}
    assert tokens("tok-lt") == {"skyfed-tok-lt-0": client_token("order-2", "skyfed-tok-lt-0")}
    assert len({*tokens("tok-bare").values(), *tokens("tok-lt").values()}) == 3


def test_a_client_token_is_its_orders_and_its_machines() -> None:
    """The same in each retry of one order for one machine; another for another machine or
    order (a later order may reuse a name a removal freed, and EC2 remembers a token after its
    instance ends); none without an order; within EC2's 64 ASCII characters."""
    token = client_token("9f" * 16, "skyfed-gpu-3")
    assert token == client_token("9f" * 16, "skyfed-gpu-3")
    assert token != client_token("9f" * 16, "skyfed-gpu-4")
    assert token != client_token("8e" * 16, "skyfed-gpu-3")
    assert client_token("", "skyfed-gpu-3") == ""
    assert len(token) <= 64
    assert token.isascii()
    assert token.isalnum()


async def test_aws_scale_pool_buys_spot_for_a_spot_pool(moto_port: int) -> None:
    """A pool the planner priced at spot must be bought at spot: before, every order launched
    on-demand machines, whatever the pool's pricing. Bare and from a launch template alike."""
    import asyncio

    _, bare, templated = _bare_and_templated(moto_port, "spot")
    labels = {"skyfed.io/cluster": "c-spot"}

    async def on_demand_vcpu() -> float:
        return {q.metric: q.used for q in await bare.get_quotas(region="us-east-1")}["vcpu"]

    before = await on_demand_vcpu()
    assert await bare.scale_pool(region="us-east-1", pool="m5-spot", instance_type="m5.large",
                                 nodes=1, labels=labels, spot=True) == 1
    # Spot has its own quota: the on-demand vCPU quota's usage does not count it.
    assert await on_demand_vcpu() == before
    assert await templated.scale_pool(region="us-east-1", pool="m5-spot-lt",
                                      instance_type="m5.large", nodes=1, labels=labels,
                                      spot=True) == 1
    assert await bare.scale_pool(region="us-east-1", pool="m5-od", instance_type="m5.large",
                                 nodes=1, labels=labels) == 1
    drv = bare._driver("us-east-1")  # type: ignore[attr-defined]

    async def lifecycle(pool: str) -> list[str]:
        listed = await asyncio.to_thread(drv.list_nodes, ex_filters={
            "tag:skyfed.io/pool": pool, "instance-state-name": ["pending", "running"]})
        return [str(n.extra.get("instance_lifecycle") or "on-demand") for n in listed]

    assert await lifecycle("m5-spot") == ["spot"]
    assert await lifecycle("m5-spot-lt") == ["spot"]
    assert await lifecycle("m5-od") == ["on-demand"]
    assert await on_demand_vcpu() == before + 2  # the m5.large bought on demand


async def test_gcp_remove_nodes_deletes_only_the_named_instance(tmp_path: Path) -> None:
    from tests.contract.fixture_server import FIXTURES

    state = FixtureState("gce")
    listing = json.loads((FIXTURES / "gce" / "zones_us-central1-a_instances.json").read_text())
    template = listing["items"][0]
    listing["items"] = [{**template, "name": n, "id": str(100 + i),
                         "labels": {"skyfed-io-pool": "gpu"}}
                        for i, n in enumerate(("lcnode-000", "lcnode-001", "node-name"))]
    state.extra["/compute/v1/projects/project_name/zones/us-central1-a/instances"] = listing
    op = "operation-zones_us-central1-a_instances_lcnode-001_delete"  # the recorded DELETE's
    state.extra[f"/compute/v1/projects/project_name/zones/us-central1-a/operations/{op}"] = \
        json.loads((FIXTURES / "gce" / f"operations_{op.replace('-', '_', 1)}.json")
                   .read_text())
    with serve(state) as port:
        p = _gcp(port, tmp_path)
        await p.remove_nodes(region="us-central1", pool="gpu", nodes=["lcnode-001", "gone-7"])
    deletes = [r for r in state.requests if r.startswith("DELETE ")]
    assert deletes == ["DELETE /compute/v1/projects/project_name/zones/us-central1-a/instances/"
                       "lcnode-001"]


async def test_gcp_scale_pool_counts_its_clusters_group_and_names_around_the_zone(
        tmp_path: Path) -> None:
    """The zone holds `skyfed-gpu-0` of another cluster's group `gpu` and `skyfed-gpu-1` of
    this cluster's: the group counts one machine, and the order's new instance takes a name
    no instance of the zone holds (GCE refuses a taken one). A spot pool's is preemptible."""
    from tests.contract.fixture_server import FIXTURES

    state = FixtureState("gce")
    listing = json.loads((FIXTURES / "gce" / "zones_us-central1-a_instances.json").read_text())
    template = listing["items"][0]
    listing["items"] = [
        {**template, "name": "skyfed-gpu-0", "id": "100",
         "labels": {"skyfed-io-pool": "gpu", "skyfed-io-cluster": "other"}},
        {**template, "name": "skyfed-gpu-1", "id": "101",
         "labels": {"skyfed-io-pool": "gpu", "skyfed-io-cluster": "c1"}}]
    state.extra["GET /compute/v1/projects/project_name/zones/us-central1-a/instances"] = listing
    state.extra["/compute/v1/projects/project_name/zones/us-central1-a/instances/"
                "skyfed-gpu-2"] = json.loads(
        (FIXTURES / "gce" / "zones_us-central1-a_instances_node-name.json").read_text())
    with serve(state) as port:
        p = _gcp(port, tmp_path)
        await p.scale_pool(region="us-central1", pool="gpu", instance_type="n1-standard-1",
                           nodes=2, labels={"skyfed.io/cluster": "c1"}, spot=True)
    [body] = [b for r, b in zip(state.requests, state.bodies, strict=True)
              if r.startswith("POST ") and r.endswith("/instances")]
    sent = json.loads(body)
    assert sent["name"] == "skyfed-gpu-2"  # one machine ordered, around both taken names
    assert sent["labels"] == {"skyfed-io-pool": "gpu", "skyfed-io-cluster": "c1"}
    assert sent["scheduling"]["preemptible"] is True


async def test_azure_declares_no_scale_pool() -> None:
    p = _azure(1)
    assert Capability.SCALE_POOL not in p.capabilities
    with pytest.raises(ProviderError, match="AKS"):
        await p.scale_pool(region="eastus", pool="p", instance_type="Standard_D2s_v3", nodes=1,
                           labels={})
    with pytest.raises(ProviderError, match="AKS"):
        await p.remove_nodes(region="eastus", pool="p", nodes=["aks-p-0"])
