"""SOAP 1.2 envelopes for the ONVIF device: parsing a request safely, writing answers and faults.

A request body is parsed only when it is small (:data:`MAX_BODY_BYTES`), UTF-8 and carries no
document type declaration: without a DTD no entity can be declared, so neither an external
entity (XXE) nor an expanding one (billion laughs) can be asked for. What is not such an
envelope is a :class:`SoapFault`, answered 400, never a 500.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from xml.sax.saxutils import escape

MAX_BODY_BYTES = 64 * 1024

SOAP_ENV = "http://www.w3.org/2003/05/soap-envelope"
NAMESPACES = {
    "s": SOAP_ENV,
    "tds": "http://www.onvif.org/ver10/device/wsdl",
    "trt": "http://www.onvif.org/ver10/media/wsdl",
    "tt": "http://www.onvif.org/ver10/schema",
    "ter": "http://www.onvif.org/ver10/error",
    "tev": "http://www.onvif.org/ver10/events/wsdl",
    "wsnt": "http://docs.oasis-open.org/wsn/b-2",
    "wstop": "http://docs.oasis-open.org/wsn/t-1",
    "wsa5": "http://www.w3.org/2005/08/addressing",
    "tns1": "http://www.onvif.org/ver10/topics",
    "xs": "http://www.w3.org/2001/XMLSchema",
    "wsse": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd",
    "wsu": "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd",
}
_DECLARATIONS = " ".join(f'xmlns:{k}="{v}"' for k, v in NAMESPACES.items())
_DOCTYPE = re.compile(r"<!\s*(DOCTYPE|ENTITY|ELEMENT|ATTLIST)", re.IGNORECASE)


class SoapFault(Exception):
    """A SOAP fault to answer: ``code`` is ``Sender`` or ``Receiver``, ``subcode`` an ONVIF
    ``ter:`` error (``NotAuthorized``, ``ActionNotSupported``, ``InvalidArgVal``...)."""

    def __init__(self, subcode: str, reason: str, *, code: str = "Sender", status: int = 400,
                 detail: str = "", retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.code = code
        self.subcode = subcode
        self.reason = reason
        self.status = status
        self.detail = detail  # a second-level ter: subcode (e.g. NoProfile), optional
        self.retry_after = retry_after  # seconds, with status 429


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed SOAP request: the Body's first element (the operation) and the Header."""

    namespace: str
    operation: str
    body: ET.Element
    header: ET.Element | None


def parse(data: bytes) -> Request:
    """The operation ``data`` asks for; :class:`SoapFault` when it is not a SOAP 1.2 envelope."""
    if len(data) > MAX_BODY_BYTES:
        raise SoapFault("InvalidArgs", f"request larger than {MAX_BODY_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SoapFault("InvalidArgs", "request is not UTF-8") from None
    if _DOCTYPE.search(text):
        raise SoapFault("InvalidArgs", "document type declarations are not accepted")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SoapFault("WellFormed", f"request is not well-formed XML: {exc}") from None
    if root.tag != f"{{{SOAP_ENV}}}Envelope":
        raise SoapFault("VersionMismatch" if root.tag.endswith("}Envelope") else "InvalidArgs",
                        "not a SOAP 1.2 envelope", code="VersionMismatch"
                        if root.tag.endswith("}Envelope") else "Sender")
    header = root.find(f"{{{SOAP_ENV}}}Header")
    body = root.find(f"{{{SOAP_ENV}}}Body")
    if body is None or len(body) == 0:
        raise SoapFault("InvalidArgs", "the envelope has no operation in its Body")
    operation = body[0]
    namespace, _, name = operation.tag[1:].partition("}") if operation.tag.startswith("{") \
        else ("", "", operation.tag)
    return Request(namespace, name, operation, header)


def text_of(element: ET.Element, path: str) -> str:
    """The stripped text at ``path`` (``ns:Name/ns:Name``, prefixes of :data:`NAMESPACES`)."""
    found = element.find(path, NAMESPACES)
    return (found.text or "").strip() if found is not None else ""


def envelope(body: str) -> bytes:
    """A SOAP 1.2 envelope around ``body`` (XML already escaped)."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<s:Envelope {_DECLARATIONS}>'
            f"<s:Body>{body}</s:Body></s:Envelope>").encode()


def fault_envelope(fault: SoapFault) -> bytes:
    """The envelope of ``fault``."""
    detail = (f"<s:Subcode><s:Value>ter:{fault.detail}</s:Value></s:Subcode>"
              if fault.detail else "")
    code = fault.code if fault.code in ("Sender", "Receiver", "VersionMismatch") else "Sender"
    return envelope(
        f"<s:Fault><s:Code><s:Value>s:{code}</s:Value><s:Subcode><s:Value>ter:{fault.subcode}"
        f"</s:Value>{detail}</s:Subcode></s:Code><s:Reason><s:Text xml:lang=\"en\">"
        f"{escape(fault.reason)}</s:Text></s:Reason></s:Fault>")


def el(tag: str, content: object = "", **attributes: object) -> str:
    """``<tag attr="...">content</tag>``; a str content is taken as XML, other values are
    written as text (bools as ``true``/``false``)."""
    attrs = "".join(f' {k.rstrip("_")}="{escape(_text(v), {chr(34): "&quot;"})}"'
                    for k, v in attributes.items())
    inner = content if isinstance(content, str) else escape(_text(content))
    return f"<{tag}{attrs}>{inner}</{tag}>"


def value(tag: str, content: object) -> str:
    """An element holding ``content`` as text, escaped."""
    return f"<{tag}>{escape(_text(content))}</{tag}>"


def _text(content: object) -> str:
    if isinstance(content, bool):
        return "true" if content else "false"
    return str(content)
