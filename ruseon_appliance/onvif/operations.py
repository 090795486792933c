"""Every ONVIF operation this device knows, with the access it needs, in one table.

*Open* operations are the ones cameras answer before authentication (a client asks
``GetSystemDateAndTime`` to learn the device's clock, then writes its UsernameToken in that
time). *View* reads what the device is and how to get its picture. *Admin* is everything
that would change state (Set*, Create*, Delete*, SystemReboot, users, firmware) or read
secrets (users, logs, backups): every one of them is also answered ``ActionNotSupported``
after the admin check, since this device changes nothing over ONVIF. An operation not in the
table is refused (``ActionNotSupported``) before any credential is looked at.
"""

from __future__ import annotations

from ruseon_appliance.access.policy import Access
from ruseon_appliance.onvif.soap import NAMESPACES

DEVICE = NAMESPACES["tds"]
MEDIA = NAMESPACES["trt"]
EVENTS = NAMESPACES["tev"]
NOTIFICATION = NAMESPACES["wsnt"]  # Renew and Unsubscribe of a PullPoint

_OPEN = ("GetSystemDateAndTime",)

# Operations answered, by service.
ANSWERED: dict[str, tuple[str, ...]] = {
    DEVICE: ("GetSystemDateAndTime", "GetCapabilities", "GetServices",
             "GetServiceCapabilities", "GetDeviceInformation", "GetNetworkInterfaces",
             "GetScopes", "GetHostname", "GetDNS", "GetNTP", "GetNetworkProtocols",
             "GetDiscoveryMode", "GetZeroConfiguration", "GetNetworkDefaultGateway",
             "GetWsdlUrl"),
    MEDIA: ("GetProfiles", "GetProfile", "GetStreamUri", "GetSnapshotUri", "GetVideoSources",
            "GetServiceCapabilities", "GetVideoSourceConfigurations",
            "GetVideoSourceConfiguration", "GetVideoEncoderConfigurations",
            "GetVideoEncoderConfiguration", "GetVideoSourceConfigurationOptions",
            "GetVideoEncoderConfigurationOptions", "GetCompatibleVideoEncoderConfigurations",
            "GetCompatibleVideoSourceConfigurations", "GetAudioSources",
            "GetAudioSourceConfigurations", "GetAudioEncoderConfigurations",
            "GetGuaranteedNumberOfVideoEncoderInstances"),
    EVENTS: ("CreatePullPointSubscription", "PullMessages", "SetSynchronizationPoint",
             "GetEventProperties", "GetServiceCapabilities"),
    NOTIFICATION: ("Renew", "Unsubscribe"),
}

# Known operations that change state or reveal what is not the picture: admin, and refused.
REFUSED: dict[str, tuple[str, ...]] = {
    DEVICE: ("SetSystemDateAndTime", "SetSystemFactoryDefault", "SystemReboot",
             "UpgradeSystemFirmware", "StartFirmwareUpgrade", "StartSystemRestore",
             "RestoreSystem", "GetSystemBackup", "GetSystemLog", "GetSystemSupportInformation",
             "GetSystemUris", "SetScopes", "AddScopes", "RemoveScopes", "SetDiscoveryMode",
             "SetRemoteDiscoveryMode", "SetHostname", "SetHostnameFromDHCP", "SetDNS", "SetNTP",
             "SetDynamicDNS", "SetNetworkInterfaces", "SetNetworkProtocols",
             "SetNetworkDefaultGateway", "SetZeroConfiguration", "SetIPAddressFilter",
             "AddIPAddressFilter", "RemoveIPAddressFilter", "GetUsers", "CreateUsers",
             "DeleteUsers", "SetUser", "GetAccessPolicy", "SetAccessPolicy",
             "CreateCertificate", "LoadCertificates", "DeleteCertificates", "GetCertificates",
             "SetCertificatesStatus", "SetRelayOutputSettings", "SetRelayOutputState",
             "SendAuxiliaryCommand", "SetRemoteUser", "GetRemoteUser", "SetUserRole",
             "DeleteUserRole", "SetDot1XConfiguration", "CreateDot1XConfiguration",
             "DeleteDot1XConfiguration", "SetGeoLocation", "DeleteGeoLocation",
             "SetHashingAlgorithm", "SetPasswordComplexityConfiguration",
             "SetAuthFailureWarningConfiguration", "SetStorageConfiguration",
             "CreateStorageConfiguration", "DeleteStorageConfiguration"),
    MEDIA: ("CreateProfile", "DeleteProfile", "AddVideoEncoderConfiguration",
            "RemoveVideoEncoderConfiguration", "AddVideoSourceConfiguration",
            "RemoveVideoSourceConfiguration", "AddAudioEncoderConfiguration",
            "RemoveAudioEncoderConfiguration", "AddAudioSourceConfiguration",
            "RemoveAudioSourceConfiguration", "AddPTZConfiguration", "RemovePTZConfiguration",
            "AddVideoAnalyticsConfiguration", "RemoveVideoAnalyticsConfiguration",
            "AddMetadataConfiguration", "RemoveMetadataConfiguration",
            "SetVideoSourceConfiguration", "SetVideoEncoderConfiguration",
            "SetAudioSourceConfiguration", "SetAudioEncoderConfiguration",
            "SetMetadataConfiguration", "SetOSD", "CreateOSD", "DeleteOSD",
            "StartMulticastStreaming", "StopMulticastStreaming", "SetSynchronizationPoint",
            "SetVideoSourceMode"),
    # Subscribe would have the device POST to any URL a client names; Seek replays history.
    EVENTS: ("Seek",),
    NOTIFICATION: ("Subscribe", "GetCurrentMessage", "PauseSubscription",
                   "ResumeSubscription"),
}


def _table() -> dict[tuple[str, str], Access]:
    table: dict[tuple[str, str], Access] = {}
    for service, names in ANSWERED.items():
        for name in names:
            table[service, name] = Access.OPEN if name in _OPEN else Access.VIEW
    for service, names in REFUSED.items():
        for name in names:
            table[service, name] = Access.ADMIN
    return table


# (service namespace, operation) -> access. The one place an ONVIF operation is classified.
OPERATIONS: dict[tuple[str, str], Access] = _table()


def operation_access(namespace: str, operation: str) -> Access | None:
    """The access ``operation`` of the service ``namespace`` needs; None when unknown."""
    return OPERATIONS.get((namespace, operation))


def answered(namespace: str, operation: str) -> bool:
    """Whether this device answers ``operation`` (the rest of the table is refused)."""
    return operation in ANSWERED.get(namespace, ())
