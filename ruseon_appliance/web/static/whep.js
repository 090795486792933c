// A small WHEP client (draft-ietf-wish-whep): POST an offer, apply the answer, DELETE on close.
//
// No trickle: the offer is sent as soon as it exists. The appliance ignores remote candidates by
// design (the browser sends the first ICE check and the server learns its address from it), so
// waiting for gathering would only delay the first frame.

/** An HTTP answer that is not 201, with the problem+json detail when the server sent one. */
export class WhepError extends Error {
  constructor(status, detail, retryAfter) {
    super(detail || `HTTP ${status}`);
    this.name = "WhepError";
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

async function problemDetail(response) {
  try {
    const type = response.headers.get("Content-Type") || "";
    if (type.includes("json")) {
      const problem = await response.json();
      return problem.detail || problem.title || "";
    }
    return (await response.text()).slice(0, 200);
  } catch {
    return "";
  }
}

export class WhepClient {
  /**
   * @param {string} endpoint  the WHEP endpoint URL, e.g. "/whep"
   * @param {{token?: string, audio?: boolean}} options  audio: also ask for the camera's sound
   *   (default true; a camera without sound answers it inactive, which costs nothing)
   */
  constructor(endpoint, options = {}) {
    this.endpoint = endpoint;
    this.token = options.token || "";
    this.audio = options.audio !== false;
    this.pc = null;
    this.sessionUrl = null;
  }

  headers(extra) {
    const headers = { ...extra };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    return headers;
  }

  /**
   * Open a receive-only session: video, and the camera's sound when it has any (Opus, in the
   * same MediaStream, so the browser keeps the two in sync). Resolves once the answer is
   * applied; media follows.
   * @param {(track: MediaStreamTrack, stream: MediaStream) => void} onTrack
   * @returns {Promise<RTCPeerConnection>}
   */
  async connect(onTrack) {
    const pc = new RTCPeerConnection({ iceServers: [], bundlePolicy: "max-bundle" });
    this.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    if (this.audio) pc.addTransceiver("audio", { direction: "recvonly" });
    pc.ontrack = (event) => {
      const stream = event.streams[0] || new MediaStream([event.track]);
      onTrack(event.track, stream);
    };
    try {
      const offer = await pc.createOffer();
      await pc.setLocalDescription(offer);
      const response = await fetch(this.endpoint, {
        method: "POST",
        headers: this.headers({ "Content-Type": "application/sdp" }),
        body: pc.localDescription.sdp,
        cache: "no-store",
      });
      if (response.status !== 201) {
        const retryAfter = Number(response.headers.get("Retry-After")) || 0;
        throw new WhepError(response.status, await problemDetail(response), retryAfter);
      }
      const location = response.headers.get("Location");
      if (location) {
        const base = new URL(this.endpoint, window.location.href);
        this.sessionUrl = new URL(location, base).href;
      }
      if (this.closed) {
        // close() came while the offer was on its way: the session exists now, so end it
        // rather than leave it holding a viewer place until the server reaps it.
        this.close();
        throw new WhepError(0, "closed while connecting", 0);
      }
      const answer = await response.text();
      await pc.setRemoteDescription({ type: "answer", sdp: answer });
      return pc;
    } catch (error) {
      this.close({ sendDelete: false });
      throw error;
    }
  }

  /** Close the peer connection and DELETE the session (best effort, survives page unload). */
  close({ sendDelete = true } = {}) {
    this.closed = true;
    const url = this.sessionUrl;
    this.sessionUrl = null;
    if (this.pc) {
      this.pc.ontrack = null;
      this.pc.onconnectionstatechange = null;
      this.pc.close();
      this.pc = null;
    }
    if (sendDelete && url) {
      fetch(url, { method: "DELETE", headers: this.headers({}), keepalive: true }).catch(() => {});
    }
  }
}

/**
 * Whether this browser can play the appliance's WebRTC (H.264), decided from what it says it
 * can do, before any offer: `{ok: true}` or `{ok: false, reason}` in words for the page. A
 * browser without RTCPeerConnection (Debian's WebKitGTK) has no WebRTC at all; one whose
 * receiver lists no H.264 (Firefox without the OpenH264 plugin) would only be refused. Where
 * the list cannot be read, WHEP tries (a 406 then says no).
 */
export function webrtcSupport() {
  if (typeof RTCPeerConnection === "undefined") {
    return { ok: false, reason: "this browser has no WebRTC" };
  }
  if (typeof RTCRtpReceiver === "undefined" || !RTCRtpReceiver.getCapabilities) return { ok: true };
  const caps = RTCRtpReceiver.getCapabilities("video");
  if (caps && !caps.codecs.some((c) => c.mimeType.toLowerCase() === "video/h264")) {
    return { ok: false, reason: "this browser has no H.264 for WebRTC" };
  }
  return { ok: true };
}
