"""AWS EC2 as a CloudProvider, on libcloud's EC2 driver (one driver per region, lazily).

- Regions: libcloud's EC2 region table, with coordinates from the catalog.
- Offers: libcloud's size table for the region (its bundled on-demand Linux prices) merged onto
  the catalog; AWS spot prices stay null (no offline source; see providers/catalog.py).
- Quotas: ``DescribeAccountAttributes`` (``max-instances``) with the running instance count as
  usage, and the vCPUs of running on-demand instances (used) against ``AwsOptions.vcpu_limit``
  when set
  (Service Quotas' "Running On-Demand Standard instances" is a separate API libcloud lacks).
- scale_pool: instances tagged ``skyfed.io/pool=<pool>`` (plus the cluster's labels) are created
  until the pool has at least the requested count, from the group's EC2 launch template when
  ``launch_template`` is set (what a machine needs to join its cluster), else bare from
  ``image_id``; remove_nodes terminates exactly the named instances of the pool (instance
  id, Name tag or private DNS name).

EC2-compatible endpoints (moto, LocalStack) are reached with ``endpoint_host``/``endpoint_port``;
they answer with the API namespace without libcloud's trailing ``/``, which ``_CompatResponse``
normalises (otherwise every list would be silently empty).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from providers.base import Capability, Offer, Quota, Region
from providers.catalog import Catalog
from providers.cloud import (
    SKYFED_CLUSTER_LABEL,
    SKYFED_POOL_LABEL,
    LibcloudBase,
    client_token,
    matching,
    new_names,
)
from providers.errors import ConfigError, NotFoundError


@dataclass(frozen=True, slots=True)
class AwsOptions:
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    regions: tuple[str, ...] = ("us-east-1",)
    image_id: str = ""  # AMI used by scale_pool (without a launch template)
    # EC2 launch template scale_pool launches from, as self-managed EKS node groups do: it
    # holds what a machine needs to join its cluster (AMI, bootstrap user data, instance
    # profile, subnets' security groups). `{group}` and `{cluster}` are replaced by the node
    # group and the cluster; "" launches a bare instance of `image_id`.
    launch_template: str = ""
    launch_template_version: str = "$Default"  # or "$Latest", or a version number
    vcpu_limit: float | None = None  # account's on-demand vCPU quota, when known
    endpoint_host: str | None = None  # EC2-compatible endpoint (moto, LocalStack)
    endpoint_port: int | None = None
    secure: bool = True
    max_concurrency: int = 4
    timeout_s: float = 30.0


def _compat_driver_cls() -> Any:
    """EC2 driver whose XML responses accept namespaces without the trailing slash."""
    from libcloud.compute.drivers.ec2 import (
        API_VERSION,
        EC2Connection,
        EC2NodeDriver,
        EC2Response,
    )

    bare = f'"http://ec2.amazonaws.com/doc/{API_VERSION}"'
    fixed = f'"http://ec2.amazonaws.com/doc/{API_VERSION}/"'

    class _CompatResponse(EC2Response):  # type: ignore[misc]
        def parse_body(self) -> Any:
            if isinstance(self.body, str) and bare in self.body:
                self.body = self.body.replace(bare, fixed)
            return super().parse_body()  # type: ignore[no-untyped-call]

    class _CompatConnection(EC2Connection):  # type: ignore[misc]
        responseCls = _CompatResponse

    class _CompatDriver(EC2NodeDriver):  # type: ignore[misc]
        connectionCls = _CompatConnection

    return _CompatDriver


def _account_limits(drv: Any) -> dict[str, float]:
    """Numeric DescribeAccountAttributes values (libcloud's ex_get_limits int()s every value,
    which fails on the non-numeric `supported-platforms` attribute)."""
    resp = drv.connection.request(drv.path, params={
        "Action": "DescribeAccountAttributes", "AttributeName.1": "max-instances",
        "AttributeName.2": "max-elastic-ips", "AttributeName.3": "vpc-max-elastic-ips",
    })
    out: dict[str, float] = {}
    for item in resp.object.iter():
        if not str(item.tag).endswith("item"):
            continue
        name = value = None
        for child in item:
            tag = str(child.tag).rsplit("}", 1)[-1]
            if tag == "attributeName":
                name = child.text
            elif tag == "attributeValueSet":
                for v in child.iter():
                    if str(v.tag).endswith("attributeValue"):
                        value = v.text
        if name and value is not None:
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


class AwsProvider(LibcloudBase):
    name = "aws"
    capabilities = frozenset({Capability.LIST_REGIONS, Capability.LIST_OFFERS,
                              Capability.LIVE_PRICES, Capability.QUOTAS, Capability.SCALE_POOL})

    def __init__(self, options: AwsOptions, *, catalog: Catalog | None = None) -> None:
        super().__init__(max_concurrency=options.max_concurrency, timeout_s=options.timeout_s,
                         catalog=catalog)
        self._opts = options
        self._drivers: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"AwsProvider(regions={self._opts.regions!r})"

    def _driver(self, region: str) -> Any:
        if region not in self._drivers:
            from libcloud.compute.drivers.ec2 import EC2NodeDriver

            ec2: Any = EC2NodeDriver
            if region not in ec2.list_regions():
                raise NotFoundError(f"unknown EC2 region {region!r}", provider="aws",
                                    region=region)
            o = self._opts
            cls = _compat_driver_cls() if o.endpoint_host else EC2NodeDriver
            kw: dict[str, Any] = {"region": region, "secure": o.secure,
                                  "signature_version": "4", "token": o.session_token}
            if o.endpoint_host:
                kw.update(host=o.endpoint_host, port=o.endpoint_port)
            self._drivers[region] = cls(o.access_key_id, o.secret_access_key, **kw)
        return self._drivers[region]

    async def list_regions(self) -> list[Region]:
        from libcloud.compute.drivers.ec2 import EC2NodeDriver

        ec2: Any = EC2NodeDriver
        names = await self._call(ec2.list_regions)
        out = []
        for n in sorted(names):
            try:
                out.append(self.catalog.region("aws", n))
            except NotFoundError:
                out.append(Region(provider="aws", name=n))
        return out

    async def list_offers(self, *, region: str) -> list[Offer]:
        drv = self._driver(region)
        sizes = await self._call(drv.list_sizes, region=region)
        live = []
        for s in sizes:
            extra = s.extra or {}
            vcpu = float(extra.get("vcpu") or extra.get("cpu") or 0)
            if not vcpu:
                continue
            live.append(Offer(
                provider="aws", region=region, instance_type=s.id, vcpu=vcpu,
                memory_gib=round(float(s.ram) / 1024.0, 3),
                price_usd_per_hour=float(s.price) if s.price else None, source="live",
            ))
        return self._merge_offers(region, live)

    async def _pool_nodes(self, region: str, pool: str,
                          labels: Mapping[str, str] | None = None) -> list[Any]:
        """The live instances of node group `pool` that carry every tag of `labels` (the
        cluster's): two clusters' groups of one name in one region and account stay apart."""
        drv = self._driver(region)
        filters: dict[str, Any] = {"instance-state-name": ["pending", "running"],
                                   f"tag:{SKYFED_POOL_LABEL}": pool}
        filters.update({f"tag:{k}": v for k, v in (labels or {}).items()})
        nodes: list[Any] = await self._call(drv.list_nodes, ex_filters=filters, region=region)
        return nodes

    async def get_quotas(self, *, region: str) -> list[Quota]:
        drv = self._driver(region)
        limits = await self._call(_account_limits, drv, region=region)
        nodes = await self._call(
            drv.list_nodes, ex_filters={"instance-state-name": ["pending", "running"]},
            region=region,
        )
        out = [Quota(provider="aws", region=region, metric="instances",
                     limit=float(limits.get("max-instances", 0)), used=float(len(nodes)))]
        if self._opts.vcpu_limit is not None:
            used = 0.0
            for n in nodes:
                if (n.extra or {}).get("instance_lifecycle") == "spot":
                    continue  # spot capacity has its own quota (Spot Instance Requests)
                itype = (n.extra or {}).get("instance_type", "")
                try:
                    used += self.catalog.offer("aws", region, itype).vcpu
                except NotFoundError:
                    continue
            out.append(Quota(provider="aws", region=region, metric="vcpu",
                             limit=self._opts.vcpu_limit, used=used))
        return out

    async def scale_pool(
        self, *, region: str, pool: str, instance_type: str, nodes: int,
        labels: Mapping[str, str], spot: bool = False, order: str = "",
    ) -> int:
        """Create tagged instances until `pool` has at least `nodes`; returns the count. It
        never terminates one (see CloudProvider.scale_pool): remove_nodes does, by name.
        With an `order`, each RunInstances carries the ClientToken of the order and the
        machine's name (`client_token`), so EC2 answers a retry of an accepted launch with
        the instance it launched."""
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        drv = self._driver(region)
        sizes = {s.id: s for s in await self._call(drv.list_sizes, region=region)}
        if instance_type not in sizes:
            raise NotFoundError(f"unknown instance type {instance_type!r}", provider="aws",
                                region=region)
        current = await self._pool_nodes(region, pool, labels)
        if len(current) >= nodes:
            return len(current)
        tags = {**labels, SKYFED_POOL_LABEL: pool}
        template = self._template(pool, labels)
        if not template and not self._opts.image_id:
            raise ConfigError("AwsOptions.image_id or launch_template is required to scale "
                              "a pool up", provider="aws", region=region)
        for name in new_names(f"skyfed-{pool}", (n.name or "" for n in current),
                              nodes - len(current)):
            token = client_token(order, name)
            if template:
                await self._call(_run_from_template, drv, name=name,
                                 instance_type=instance_type, template=template,
                                 version=self._opts.launch_template_version, tags=tags,
                                 spot=spot, token=token, region=region)
            else:
                from libcloud.compute.base import NodeImage

                image = NodeImage(id=self._opts.image_id, name=self._opts.image_id, driver=drv)
                await self._call(drv.create_node, name=name, size=sizes[instance_type],
                                 image=image, ex_metadata=tags, ex_spot=spot,
                                 ex_clienttoken=token or None, region=region)
        return len(await self._pool_nodes(region, pool, labels))

    def _template(self, group: str, labels: Mapping[str, str]) -> str:
        """The launch template's name for `group` of the cluster `labels` names."""
        pattern = self._opts.launch_template
        if not pattern:
            return ""
        cluster = labels.get(SKYFED_CLUSTER_LABEL, "")
        if "{cluster}" in pattern and not cluster:
            raise ConfigError(f"AwsOptions.launch_template {pattern!r} names {{cluster}}, and "
                              f"node group {group!r} has no cluster label", provider="aws")
        return pattern.replace("{group}", group).replace("{cluster}", cluster)

    async def remove_nodes(self, *, region: str, pool: str, nodes: Sequence[str],
                           labels: Mapping[str, str] | None = None) -> int:
        """Terminate the instances of `pool` named by `nodes`: an instance id (`i-...`, the
        tail of an EKS node's providerID), the Name tag, or the private DNS name (an EKS
        node's name); see CloudProvider.remove_nodes."""
        drv = self._driver(region)
        for node in matching(await self._pool_nodes(region, pool, labels), nodes,
                             _instance_keys):
            await self._call(drv.destroy_node, node, region=region)
        return len(await self._pool_nodes(region, pool, labels))


def _run_from_template(drv: Any, *, name: str, instance_type: str, template: str,
                       version: str, tags: Mapping[str, str], spot: bool = False,
                       token: str = "") -> Any:
    """RunInstances from launch template `template` (libcloud's create_node takes no
    template), with the pool's instance type and the node group's tags, as create_node
    sets them; the new instance, as libcloud's Node."""
    params: dict[str, str] = {
        "Action": "RunInstances", "MinCount": "1", "MaxCount": "1",
        "InstanceType": instance_type,
        "LaunchTemplate.LaunchTemplateName": template, "LaunchTemplate.Version": version,
        "TagSpecification.1.ResourceType": "instance",
    }
    if spot:  # as create_node's ex_spot: a one-time spot request at up to the on-demand price
        params["InstanceMarketOptions.MarketType"] = "spot"
    if token:  # as create_node's ex_clienttoken
        params["ClientToken"] = token
    for i, (k, v) in enumerate({"Name": name, **tags}.items(), start=1):
        params[f"TagSpecification.1.Tag.{i}.Key"] = k
        params[f"TagSpecification.1.Tag.{i}.Value"] = v
    body = drv.connection.request(drv.path, params=params).object
    (node,) = drv._to_nodes(body, "instancesSet/item")  # noqa: SLF001 - create_node's parser
    return node


def _instance_keys(node: Any) -> tuple[str, ...]:
    extra = node.extra or {}
    return (str(node.id or ""), str(node.name or ""), str(extra.get("private_dns") or ""),
            str(extra.get("dns_name") or ""))
