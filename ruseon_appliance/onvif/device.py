"""The ONVIF device (Profile S): the Device and Media (ver10) services as SOAP over HTTP.

``POST /onvif/device_service`` and ``POST /onvif/media_service`` on the appliance's HTTP
server. Both paths are OPEN at the HTTP layer (access/policy.py) because ONVIF authenticates
inside the envelope: each operation's access is in :mod:`.operations`, checked against the
request's WS-Security UsernameToken (:mod:`.security`), and wrong credentials count in the
shared :class:`FailureThrottle` (protocol ``onvif``). Every camera is one media profile whose
token is the camera's name, its stream the RTSP server's ``rtsp://HOST:PORT/<camera>`` and
its snapshot ``/snapshot/<camera>.jpg``; a camera with a sub-stream has a second profile,
``<camera>.sub``, with its own encoder configuration, ``rtsp://HOST:PORT/<camera>/sub`` and
``/snapshot/<camera>.jpg?stream=sub`` (both share the camera's video source configuration).
Nothing here changes the device: every Set*, Create* or reboot is refused.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.etree.ElementTree import Element

from aiohttp import web

from ruseon_appliance import __version__
from ruseon_appliance.access.credentials import Credentials
from ruseon_appliance.access.policy import Access, Role
from ruseon_appliance.onvif import operations
from ruseon_appliance.onvif.events import PULLPOINT_PATH, EventService
from ruseon_appliance.onvif.interfaces import Interface, interface_for
from ruseon_appliance.onvif.security import Account, UsernameTokenVerifier
from ruseon_appliance.onvif.soap import (
    MAX_BODY_BYTES,
    Request,
    SoapFault,
    el,
    envelope,
    fault_envelope,
    parse,
    text_of,
    value,
)
from ruseon_appliance.web.access import request_address

if TYPE_CHECKING:
    from ruseon_appliance.cameras import Camera
    from ruseon_appliance.config import CameraConfig, Config

log = logging.getLogger(__name__)

DEVICE_PATH = "/onvif/device_service"
MEDIA_PATH = "/onvif/media_service"
EVENTS_PATH = "/onvif/events_service"
SOAP_TYPE = "application/soap+xml"
MANUFACTURER = "RUSEON"
MODEL = "RUSEON Appliance"


@dataclass(frozen=True, slots=True)
class Identity:
    """What the device says it is (GetDeviceInformation, the scopes, discovery)."""

    serial: str
    hostname: str
    hardware: str

    @property
    def endpoint(self) -> str:
        """The WS-Discovery endpoint reference: stable, from the serial."""
        return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'ruseon:' + self.serial)}"

    def scopes(self) -> list[str]:
        """The ONVIF scopes (GetScopes, ProbeMatch)."""
        base = "onvif://www.onvif.org/"
        return [f"{base}Profile/Streaming", f"{base}type/video_encoder",
                f"{base}type/Network_Video_Transmitter", f"{base}hardware/{_scope(self.hardware)}",
                f"{base}name/{_scope(self.hostname)}", f"{base}location/ruseon"]


def _scope(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "unknown"


def board_model() -> str:
    """The board's model (a Pi's device tree), else ``generic``."""
    try:
        with open("/proc/device-tree/model", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip("\x00\n ") or "generic"
    except OSError:
        return "generic"


@dataclass(frozen=True, slots=True)
class Stream:
    """One media profile: a camera's main stream (token: the camera's name) or its sub-stream
    (``<name>.sub``: a camera name has no dot, so no camera's token collides with it).

    What it reads of the camera is the interface the appliance gives this room: its
    ``name``, ``config`` and ``pipeline`` (``stream_info``: the size the camera really sends),
    and ``sub``, the sub-stream's pipeline or None, whose ``camera`` has the sub-stream's
    size, frame rate, bitrate and GOP."""

    camera: Camera
    sub: bool

    @property
    def token(self) -> str:
        """The profile token."""
        return f"{self.camera.name}.sub" if self.sub else self.camera.name

    @property
    def encoder_token(self) -> str:
        """The video encoder configuration's token."""
        return f"vec_{self.token}"

    @property
    def path(self) -> str:
        """The RTSP server's path of this stream."""
        return f"{self.camera.name}/sub" if self.sub else self.camera.name

    @property
    def config(self) -> CameraConfig:
        """What the stream is encoded with (frame rate, bitrate, GOP, profile)."""
        sub = self.camera.sub
        return sub.camera if self.sub and sub is not None else self.camera.config

    def size(self) -> tuple[int, int]:
        """The picture's size: what the camera sends, else what it was asked for."""
        pipeline = self.camera.sub if self.sub else self.camera.pipeline
        info = pipeline.stream_info if pipeline is not None else None
        if info is not None:
            return info.width, info.height
        return self.config.width, self.config.height


class OnvifDevice:
    """Answers the ONVIF Device and Media services for every camera."""

    def __init__(self, config: Config, cameras: Iterable[Camera], credentials: Credentials,
                 identity: Identity, *, rtsp_port: Callable[[], int | None],
                 clock: Callable[[], float] = time.time,
                 clock_synchronized: Callable[[], bool] = lambda: True) -> None:
        self.config = config
        self.cameras = list(cameras)
        self.credentials = credentials
        self.identity = identity
        self.rtsp_port = rtsp_port
        self.clock = clock
        self.events = EventService([c.name for c in self.cameras], clock=clock)
        self.verifier = UsernameTokenVerifier(self.accounts, clock=clock,
                                              synchronized=clock_synchronized)
        self.interface: Interface = interface_for(config.http.listen.host, identity.serial)
        self.requests: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.auth_failures = 0

    def accounts(self) -> list[Account]:
        """``[onvif] username`` (default ``admin``) with ``[onvif] password``, else the
        admin secret (live: a rotated secret counts at once); the viewer token, if any, as
        user ``viewer`` with view access."""
        onvif = self.config.onvif
        out = [Account(onvif.username or "admin",
                       onvif.resolve_password() or self.credentials.admin.value, Role.ADMIN)]
        if self.credentials.viewer_token:
            out.append(Account("viewer", self.credentials.viewer_token, Role.VIEWER))
        return out

    def add_routes(self, app: web.Application) -> None:
        """``POST`` on both service paths (one handler: the operation's namespace decides)."""
        app.router.add_post(DEVICE_PATH, self.handle)
        app.router.add_post(MEDIA_PATH, self.handle)
        app.router.add_post(EVENTS_PATH, self.handle)
        app.router.add_post(PULLPOINT_PATH, self.handle)

    # --- the request --------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        """One SOAP request: parse, classify, authenticate, answer (or a fault)."""
        try:
            body = await self._answer(request)
        except SoapFault as fault:
            self.faults[fault.subcode] = self.faults.get(fault.subcode, 0) + 1
            headers = ({"Retry-After": str(fault.retry_after)}
                       if fault.retry_after is not None else {})
            return web.Response(status=fault.status, body=fault_envelope(fault),
                                content_type=SOAP_TYPE, charset="utf-8", headers=headers)
        return web.Response(body=envelope(body), content_type=SOAP_TYPE, charset="utf-8")

    async def _answer(self, request: web.Request) -> str:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise SoapFault("InvalidArgs", f"request larger than {MAX_BODY_BYTES} bytes")
        # Chunked bodies have no length: read up to one byte past the limit, however it arrives.
        data = b""
        while len(data) <= MAX_BODY_BYTES:
            chunk = await request.content.read(MAX_BODY_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
        soap = parse(data)
        access = operations.operation_access(soap.namespace, soap.operation)
        if access is None:
            raise SoapFault("ActionNotSupported",
                            f"{soap.operation} ({soap.namespace}) is not an operation of "
                            "this device")
        self.requests[soap.operation] = self.requests.get(soap.operation, 0) + 1
        if access > Access.OPEN:
            self._authorize(request, soap, access)
        if not operations.answered(soap.namespace, soap.operation):
            raise SoapFault("ActionNotSupported",
                            f"{soap.operation}: this device changes nothing over ONVIF")
        sub_id = request.match_info.get("id")
        if soap.namespace in (operations.EVENTS, operations.NOTIFICATION):
            return await self._event(request, soap, sub_id)
        service = "device" if soap.namespace == operations.DEVICE else "media"
        handler: Callable[[web.Request, Element], str] = getattr(
            self, f"_{service}_{soap.operation}")
        return handler(request, soap.body)

    async def _event(self, request: web.Request, soap: Request, sub_id: str | None) -> str:
        """The events service, and a PullPoint's own operations at its address."""
        events, body, op = self.events, soap.body, soap.operation
        on_pullpoint = op in ("PullMessages", "Renew", "Unsubscribe", "SetSynchronizationPoint")
        if on_pullpoint != (sub_id is not None):
            raise SoapFault("ActionNotSupported", f"{op} is not an operation of this address")
        if op == "CreatePullPointSubscription":
            return events.create(
                lambda i: self._xaddr(request, PULLPOINT_PATH.format(id=i)),
                text_of(body, "tev:InitialTerminationTime"))
        if op == "GetEventProperties":
            return events.properties()
        if op == "GetServiceCapabilities":
            return el("tev:GetServiceCapabilitiesResponse", self._events_capabilities())
        assert sub_id is not None
        if op == "PullMessages":
            return await events.pull(sub_id, text_of(body, "tev:Timeout"),
                                     text_of(body, "tev:MessageLimit"))
        if op == "Renew":
            return events.renew(sub_id, text_of(body, "wsnt:TerminationTime"))
        if op == "Unsubscribe":
            return events.unsubscribe(sub_id)
        return events.synchronize(sub_id)

    @staticmethod
    def _events_capabilities() -> str:
        return el("tev:Capabilities", "", WSSubscriptionPolicySupport=False,
                  WSPullPointSupport=True, WSPausableSubscriptionManagerInterfaceSupport=False,
                  MaxNotificationProducers=0, MaxPullPoints=8,
                  PersistentNotificationStorage=False)

    def _authorize(self, request: web.Request, soap: Request, access: Access) -> None:
        address = request_address(request)
        throttle = self.credentials.throttle
        wait = throttle.retry_after(address, "onvif")
        if wait is not None:
            raise SoapFault("NotAuthorized", f"too many wrong credentials; retry in {wait} s",
                            status=429, retry_after=wait)
        try:
            role, _user = self.verifier.role_of(soap.header)
        except SoapFault:
            self.auth_failures += 1
            throttle.failed(address, "onvif")
            raise
        if role is None:
            raise SoapFault("NotAuthorized",
                            f"{soap.operation} needs a WS-Security UsernameToken")
        throttle.succeeded(address, role)
        if role < access:
            raise SoapFault("NotAuthorized", f"{soap.operation} needs the admin account")

    # --- where things are ---------------------------------------------------------------

    def _host(self, request: web.Request) -> str:
        host = request.url.host or self.interface.address
        return f"[{host}]" if ":" in host else host

    def _xaddr(self, request: web.Request, path: str) -> str:
        return f"{request.scheme}://{request.host}{path}"

    def streams(self) -> list[Stream]:
        """Every media profile: every camera's main stream, then the sub-streams (read per
        request: ``Camera.sub`` is the camera's own business). Mains first so a profile's
        position stays what it was before sub-streams (Home Assistant before its token-based
        unique ids numbered camera entities by position)."""
        return ([Stream(c, sub=False) for c in self.cameras]
                + [Stream(c, sub=True) for c in self.cameras if c.sub is not None])

    def _stream(self, body: Element) -> Stream:
        token = text_of(body, "trt:ProfileToken")
        for stream in self.streams():
            if stream.token == token:
                return stream
        raise SoapFault("InvalidArgVal", f"no profile {token!r}", detail="NoProfile")

    # --- Device service -----------------------------------------------------------------

    def _device_GetSystemDateAndTime(self, request: web.Request, body: Element) -> str:
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        stamp = el("tt:Time", value("tt:Hour", now.hour) + value("tt:Minute", now.minute)
                   + value("tt:Second", now.second)) + el(
            "tt:Date", value("tt:Year", now.year) + value("tt:Month", now.month)
            + value("tt:Day", now.day))
        return el("tds:GetSystemDateAndTimeResponse", el(
            "tds:SystemDateAndTime",
            value("tt:DateTimeType", "NTP") + value("tt:DaylightSavings", False)
            + el("tt:TimeZone", value("tt:TZ", "UTC0"))
            + el("tt:UTCDateTime", stamp) + el("tt:LocalDateTime", stamp)))

    def _device_GetCapabilities(self, request: web.Request, body: Element) -> str:
        device = el("tt:Device", value("tt:XAddr", self._xaddr(request, DEVICE_PATH))
                    + el("tt:Network", value("tt:IPFilter", False)
                         + value("tt:ZeroConfiguration", False) + value("tt:IPVersion6", False)
                         + value("tt:DynDNS", False))
                    + el("tt:System", value("tt:DiscoveryResolve", False)
                         + value("tt:DiscoveryBye", True) + value("tt:RemoteDiscovery", False)
                         + value("tt:SystemBackup", False) + value("tt:SystemLogging", False)
                         + value("tt:FirmwareUpgrade", False)
                         + el("tt:SupportedVersions", value("tt:Major", 2)
                              + value("tt:Minor", 0)))
                    + el("tt:Security", "".join(value(f"tt:{name}", False) for name in (
                        "TLS1.1", "TLS1.2", "OnboardKeyGeneration", "AccessPolicyConfig",
                        "X.509Token", "SAMLToken", "KerberosToken", "RELToken"))))
        events = el("tt:Events", value("tt:XAddr", self._xaddr(request, EVENTS_PATH))
                    + value("tt:WSSubscriptionPolicySupport", False)
                    + value("tt:WSPullPointSupport", True)
                    + value("tt:WSPausableSubscriptionManagerInterfaceSupport", False))
        media = el("tt:Media", value("tt:XAddr", self._xaddr(request, MEDIA_PATH))
                   + el("tt:StreamingCapabilities", value("tt:RTPMulticast", False)
                        + value("tt:RTP_TCP", True) + value("tt:RTP_RTSP_TCP", True)))
        return el("tds:GetCapabilitiesResponse", el("tds:Capabilities", device + events + media))

    def _device_GetServices(self, request: web.Request, body: Element) -> str:
        include = text_of(body, "tds:IncludeCapability").lower() == "true"
        services = []
        for namespace, path, capabilities, major in (
                (operations.DEVICE, DEVICE_PATH, self._device_capabilities, 2),
                (operations.MEDIA, MEDIA_PATH, self._media_capabilities, 2),
                (operations.EVENTS, EVENTS_PATH, self._events_capabilities, 2)):
            extra = el("tds:Capabilities", capabilities()) if include else ""
            services.append(el("tds:Service", value("tds:Namespace", namespace)
                               + value("tds:XAddr", self._xaddr(request, path)) + extra
                               + el("tds:Version", value("tt:Major", major)
                                    + value("tt:Minor", 0))))
        return el("tds:GetServicesResponse", "".join(services))

    def _device_capabilities(self) -> str:
        return el("tds:Capabilities",
                  el("tds:Network", "", IPFilter=False, ZeroConfiguration=False,
                     IPVersion6=False, DynDNS=False, NTP=0, HostnameFromDHCP=False)
                  + el("tds:Security", "", UsernameToken=True, HttpDigest=False,
                       **{"TLS1.2": False})
                  + el("tds:System", "", DiscoveryResolve=False, DiscoveryBye=True,
                       RemoteDiscovery=False, SystemBackup=False, SystemLogging=False,
                       FirmwareUpgrade=False))

    def _device_GetServiceCapabilities(self, request: web.Request, body: Element) -> str:
        return el("tds:GetServiceCapabilitiesResponse", self._device_capabilities())

    def _device_GetDeviceInformation(self, request: web.Request, body: Element) -> str:
        return el("tds:GetDeviceInformationResponse",
                  value("tds:Manufacturer", MANUFACTURER) + value("tds:Model", MODEL)
                  + value("tds:FirmwareVersion", __version__)
                  + value("tds:SerialNumber", self.identity.serial)
                  + value("tds:HardwareId", self.identity.hardware))

    def _device_GetNetworkInterfaces(self, request: web.Request, body: Element) -> str:
        nic = self.interface
        ipv4 = el("tt:IPv4", value("tt:Enabled", True) + el(
            "tt:Config", el("tt:Manual", value("tt:Address", nic.address)
                            + value("tt:PrefixLength", nic.prefix_length))
            + value("tt:DHCP", False)))
        return el("tds:GetNetworkInterfacesResponse", el(
            "tds:NetworkInterfaces", value("tt:Enabled", True)
            + el("tt:Info", value("tt:Name", nic.name) + value("tt:HwAddress", nic.mac)
                 + value("tt:MTU", nic.mtu)) + ipv4, token=nic.name))

    def _device_GetScopes(self, request: web.Request, body: Element) -> str:
        return el("tds:GetScopesResponse", "".join(
            el("tds:Scopes", value("tt:ScopeDef", "Fixed") + value("tt:ScopeItem", scope))
            for scope in self.identity.scopes()))

    def _device_GetHostname(self, request: web.Request, body: Element) -> str:
        return el("tds:GetHostnameResponse", el(
            "tds:HostnameInformation", value("tt:FromDHCP", False)
            + value("tt:Name", self.identity.hostname)))

    def _device_GetDNS(self, request: web.Request, body: Element) -> str:
        return el("tds:GetDNSResponse", el("tds:DNSInformation", value("tt:FromDHCP", True)))

    def _device_GetNTP(self, request: web.Request, body: Element) -> str:
        return el("tds:GetNTPResponse", el("tds:NTPInformation", value("tt:FromDHCP", True)))

    def _device_GetNetworkProtocols(self, request: web.Request, body: Element) -> str:
        protocols = [("HTTP", True, self.config.http.listen.port)]
        port = self.rtsp_port()
        protocols.append(("RTSP", port is not None, port or self.config.rtsp.listen.port))
        return el("tds:GetNetworkProtocolsResponse", "".join(
            el("tds:NetworkProtocols", value("tt:Name", name) + value("tt:Enabled", on)
               + value("tt:Port", number)) for name, on, number in protocols))

    def _device_GetDiscoveryMode(self, request: web.Request, body: Element) -> str:
        return el("tds:GetDiscoveryModeResponse", value("tds:DiscoveryMode", "Discoverable"))

    def _device_GetZeroConfiguration(self, request: web.Request, body: Element) -> str:
        return el("tds:GetZeroConfigurationResponse", el(
            "tds:ZeroConfiguration", value("tt:InterfaceToken", self.interface.name)
            + value("tt:Enabled", False)))

    def _device_GetNetworkDefaultGateway(self, request: web.Request, body: Element) -> str:
        return el("tds:GetNetworkDefaultGatewayResponse", el("tds:NetworkGateway", ""))

    def _device_GetWsdlUrl(self, request: web.Request, body: Element) -> str:
        return el("tds:GetWsdlUrlResponse", value("tds:WsdlUrl", "http://www.onvif.org/"))

    # --- Media service ------------------------------------------------------------------

    def _source_configuration(self, camera: Camera) -> str:
        """The camera's one video source configuration (its sensor), shared by its profiles."""
        width, height = Stream(camera, sub=False).size()
        return (value("tt:Name", camera.name)
                + value("tt:UseCount", 2 if camera.sub is not None else 1)
                + value("tt:SourceToken", f"src_{camera.name}")
                + el("tt:Bounds", "", x=0, y=0, width=width, height=height))

    def _encoder_configuration(self, stream: Stream) -> str:
        width, height = stream.size()
        cfg = stream.config
        profile = {"baseline": "Baseline", "main": "Main", "high": "High"}.get(
            cfg.profile.lower(), "Baseline")
        return (value("tt:Name", stream.token) + value("tt:UseCount", 1)
                + value("tt:Encoding", "H264")
                + el("tt:Resolution", value("tt:Width", width) + value("tt:Height", height))
                + value("tt:Quality", 5)
                + el("tt:RateControl", value("tt:FrameRateLimit", cfg.framerate)
                     + value("tt:EncodingInterval", 1)
                     + value("tt:BitrateLimit", max(1, cfg.bitrate // 1000)))
                + el("tt:H264", value("tt:GovLength", cfg.keyframe_interval)
                     + value("tt:H264Profile", profile))
                + el("tt:Multicast", el("tt:Address", value("tt:Type", "IPv4")
                                        + value("tt:IPv4Address", "0.0.0.0"))
                     + value("tt:Port", 0) + value("tt:TTL", 0) + value("tt:AutoStart", False))
                + value("tt:SessionTimeout", "PT60S"))

    def _profile(self, tag: str, stream: Stream) -> str:
        camera = stream.camera
        return el(tag, value("tt:Name", stream.token)
                  + el("tt:VideoSourceConfiguration", self._source_configuration(camera),
                       token=f"vsc_{camera.name}")
                  + el("tt:VideoEncoderConfiguration", self._encoder_configuration(stream),
                       token=stream.encoder_token), token=stream.token, fixed=True)

    def _media_GetProfiles(self, request: web.Request, body: Element) -> str:
        return el("trt:GetProfilesResponse", "".join(
            self._profile("trt:Profiles", s) for s in self.streams()))

    def _media_GetProfile(self, request: web.Request, body: Element) -> str:
        return el("trt:GetProfileResponse", self._profile("trt:Profile", self._stream(body)))

    def _media_GetStreamUri(self, request: web.Request, body: Element) -> str:
        stream = self._stream(body)
        port = self.rtsp_port()
        if port is None:
            raise SoapFault("ActionNotSupported", "RTSP is off on this device, so there is no "
                            "stream URI: set [rtsp] enable = true", code="Receiver",
                            detail="StreamingNotSupported")
        return el("trt:GetStreamUriResponse", self._media_uri(
            f"rtsp://{self._host(request)}:{port}/{stream.path}"))

    def _media_GetSnapshotUri(self, request: web.Request, body: Element) -> str:
        stream = self._stream(body)
        query = "?stream=sub" if stream.sub else ""
        return el("trt:GetSnapshotUriResponse", self._media_uri(
            f"{request.scheme}://{request.host}/snapshot/{stream.camera.name}.jpg{query}"))

    @staticmethod
    def _media_uri(uri: str) -> str:
        return el("trt:MediaUri", value("tt:Uri", uri) + value("tt:InvalidAfterConnect", False)
                  + value("tt:InvalidAfterReboot", False) + value("tt:Timeout", "PT0S"))

    def _media_GetVideoSources(self, request: web.Request, body: Element) -> str:
        sources = []
        for camera in self.cameras:
            width, height = Stream(camera, sub=False).size()
            sources.append(el("trt:VideoSources", value("tt:Framerate", camera.config.framerate)
                              + el("tt:Resolution", value("tt:Width", width)
                                   + value("tt:Height", height)), token=f"src_{camera.name}"))
        return el("trt:GetVideoSourcesResponse", "".join(sources))

    def _media_capabilities(self) -> str:
        return el("trt:Capabilities", el("trt:ProfileCapabilities", "",
                                         MaximumNumberOfProfiles=len(self.streams()))
                  + el("trt:StreamingCapabilities", "", RTPMulticast=False, RTP_TCP=True,
                       RTP_RTSP_TCP=True, NonAggregateControl=False, NoRTSPStreaming=False),
                  SnapshotUri=True, Rotation=False, VideoSourceMode=False, OSD=False,
                  EXICompression=False)

    def _media_GetServiceCapabilities(self, request: web.Request, body: Element) -> str:
        return el("trt:GetServiceCapabilitiesResponse", self._media_capabilities())

    def _source_by_configuration(self, body: Element) -> Camera:
        token = text_of(body, "trt:ConfigurationToken")
        for camera in self.cameras:
            if token == f"vsc_{camera.name}":
                return camera
        raise SoapFault("InvalidArgVal", f"no configuration {token!r}", detail="NoConfig")

    def _encoder_by_configuration(self, body: Element) -> Stream:
        token = text_of(body, "trt:ConfigurationToken")
        for stream in self.streams():
            if token == stream.encoder_token:
                return stream
        raise SoapFault("InvalidArgVal", f"no configuration {token!r}", detail="NoConfig")

    def _media_GetVideoSourceConfigurations(self, request: web.Request, body: Element) -> str:
        return el("trt:GetVideoSourceConfigurationsResponse", "".join(
            el("trt:Configurations", self._source_configuration(c), token=f"vsc_{c.name}")
            for c in self.cameras))

    def _media_GetCompatibleVideoSourceConfigurations(self, request: web.Request,
                                                      body: Element) -> str:
        camera = self._stream(body).camera
        return el("trt:GetCompatibleVideoSourceConfigurationsResponse", el(
            "trt:Configurations", self._source_configuration(camera),
            token=f"vsc_{camera.name}"))

    def _media_GetVideoSourceConfiguration(self, request: web.Request, body: Element) -> str:
        camera = self._source_by_configuration(body)
        return el("trt:GetVideoSourceConfigurationResponse", el(
            "trt:Configuration", self._source_configuration(camera),
            token=f"vsc_{camera.name}"))

    def _media_GetVideoEncoderConfigurations(self, request: web.Request, body: Element) -> str:
        return el("trt:GetVideoEncoderConfigurationsResponse", "".join(
            el("trt:Configurations", self._encoder_configuration(s), token=s.encoder_token)
            for s in self.streams()))

    def _media_GetCompatibleVideoEncoderConfigurations(self, request: web.Request,
                                                       body: Element) -> str:
        stream = self._stream(body)
        return el("trt:GetCompatibleVideoEncoderConfigurationsResponse", el(
            "trt:Configurations", self._encoder_configuration(stream),
            token=stream.encoder_token))

    def _media_GetVideoEncoderConfiguration(self, request: web.Request, body: Element) -> str:
        stream = self._encoder_by_configuration(body)
        return el("trt:GetVideoEncoderConfigurationResponse", el(
            "trt:Configuration", self._encoder_configuration(stream),
            token=stream.encoder_token))

    def _options_stream(self, body: Element) -> Stream:
        """The profile a Get*ConfigurationOptions names: by configuration token (a source's
        is its camera's main stream), else by profile token, else the first."""
        token = text_of(body, "trt:ConfigurationToken")
        if token:
            for stream in self.streams():
                if token == stream.encoder_token or (
                        not stream.sub and token == f"vsc_{stream.camera.name}"):
                    return stream
        profile = text_of(body, "trt:ProfileToken")
        return self._stream(body) if profile else self.streams()[0]

    def _media_GetVideoSourceConfigurationOptions(self, request: web.Request,
                                                  body: Element) -> str:
        camera = self._options_stream(body).camera
        width, height = Stream(camera, sub=False).size()
        return el("trt:GetVideoSourceConfigurationOptionsResponse", el(
            "trt:Options", el("tt:BoundsRange", el("tt:XRange", _range(0, 0))
                              + el("tt:YRange", _range(0, 0))
                              + el("tt:WidthRange", _range(width, width))
                              + el("tt:HeightRange", _range(height, height)))
            + value("tt:VideoSourceTokensAvailable", f"src_{camera.name}")))

    def _media_GetVideoEncoderConfigurationOptions(self, request: web.Request,
                                                   body: Element) -> str:
        stream = self._options_stream(body)
        width, height = stream.size()
        cfg = stream.config
        profile = {"main": "Main", "high": "High"}.get(cfg.profile.lower(), "Baseline")
        h264 = el("tt:H264", el("tt:ResolutionsAvailable", value("tt:Width", width)
                                + value("tt:Height", height))
                  + el("tt:GovLengthRange", _range(cfg.keyframe_interval, cfg.keyframe_interval))
                  + el("tt:FrameRateRange", _range(cfg.framerate, cfg.framerate))
                  + el("tt:EncodingIntervalRange", _range(1, 1))
                  + value("tt:H264ProfilesSupported", profile))
        return el("trt:GetVideoEncoderConfigurationOptionsResponse", el(
            "trt:Options", el("tt:QualityRange", _range(5, 5)) + h264))

    def _media_GetAudioSources(self, request: web.Request, body: Element) -> str:
        return el("trt:GetAudioSourcesResponse", "")

    def _media_GetAudioSourceConfigurations(self, request: web.Request, body: Element) -> str:
        return el("trt:GetAudioSourceConfigurationsResponse", "")

    def _media_GetAudioEncoderConfigurations(self, request: web.Request, body: Element) -> str:
        return el("trt:GetAudioEncoderConfigurationsResponse", "")

    def _media_GetGuaranteedNumberOfVideoEncoderInstances(self, request: web.Request,
                                                          body: Element) -> str:
        camera = self._source_by_configuration(body)
        encoders = 2 if camera.sub is not None else 1  # the main stream's, the sub-stream's
        return el("trt:GetGuaranteedNumberOfVideoEncoderInstancesResponse",
                  value("trt:TotalNumber", encoders) + value("trt:H264", encoders))

    # --- status -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The ``onvif`` part of ``/api/status`` (admin)."""
        return {"profiles": [s.token for s in self.streams()], "rtsp": self.rtsp_port() is not None,
                "interface": self.interface.name, "mac": self.interface.mac,
                "mac_derived": not self.interface.real_mac, "serial": self.identity.serial,
                "requests": dict(self.requests), "faults": dict(self.faults),
                "auth_failures": self.auth_failures, "events": self.events.stats()}


def _range(low: int, high: int) -> str:
    return value("tt:Min", low) + value("tt:Max", high)


def hostname() -> str:
    """This machine's host name."""
    return socket.gethostname() or "ruseon"


__all__ = ["DEVICE_PATH", "EVENTS_PATH", "MEDIA_PATH", "Identity", "OnvifDevice", "board_model",
           "hostname"]
