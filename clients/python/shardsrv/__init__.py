"""Client for shardsrv: fetch remapped tensor shards over HTTP.

Standard library only. numpy and torch (1.13 or newer) are used when installed, by ``to_numpy``,
``to_torch`` and ``fetch_into`` of a tensor.

    from shardsrv import Client, parse_safetensors
    c = Client("http://shardsrv:8080")
    rank = {"engine": "vllm", "tensor_parallel_size": 2, "tp_rank": 1}
    body = c.fetch("qwen2-moe-tiny", layout=rank, format="safetensors")  # the parameters vLLM holds on the rank
    tensors, meta = parse_safetensors(body)
    table = c.layout("qwen2-moe-tiny", rank)             # the explicit table the layout expands to
    raw = c.fetch("qwen2-moe-tiny", tensors=table)       # an explicit (perhaps edited) table
    raw = c.fetch({"checkpoint": "qwen2-moe-tiny", "tensors": table})   # or a whole request body
    body, digest = c.fetch_verified("qwen2-moe-tiny", layout=rank)   # and the digest it was checked against

The server lays out whole models from the checkpoint's config.json, so the layouts live in one
place; a table of your own goes in ``tensors`` (see README.md for blocks and boxes).

Every shard the server sends carries its SHA-256 in an RFC 9530 ``Repr-Digest`` field — a trailer
the first time the server streams a body, a header once it knows the body's digest; each fetch
hashes the body as it reads it and checks it, retrying a mismatch like a broken body and raising
``DigestError`` when the attempts run out. ``Client(..., digest=False)`` declines the digest.
"""

import base64
import ctypes
import email.utils
import hashlib
import http.client
import json
import logging
import os
import random
import re
import ssl
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["Client", "DigestError", "ProblemError", "ShortBodyError", "parse_safetensors", "to_numpy", "to_torch"]

log = logging.getLogger("shardsrv")

# Statuses another attempt may cure: a time-out or overload (408, 429, 503, 504), storage trouble
# (502), a checkpoint file that changed under the request (409: the next attempt reads the new
# version). Any other 4xx is the request's fault and fails the same way every time. A 5xx problem
# whose "retryable" member is false (bytes that fail their signature, a store denying access) is
# not retried either; the server decides that, as for the Go client.
RETRY_STATUSES = frozenset({408, 409, 429, 502, 503, 504})

_CHUNK = 4 << 20  # bytes read at once: the unit of progress reports


class ProblemError(Exception):
    """An RFC 9457 problem the server answered with."""

    def __init__(self, status, title, detail=None, errors=None, type_=None, retryable_member=None):
        self.status, self.title, self.detail = status, title, detail
        self.errors, self.type = errors or [], type_
        self.retryable_member = retryable_member  # the problem's "retryable"; None when it has none
        self.retry_after = None
        lines = [f"shardsrv: {status} {title}" + (f": {detail}" if detail else "")]
        lines += [f"  {e.get('pointer')}: {e.get('detail')}" for e in self.errors]
        super().__init__("\n".join(lines))

    @property
    def retryable(self):
        return self.status in RETRY_STATUSES and (self.status < 500 or self.retryable_member is not False)


class ShortBodyError(Exception):
    """The body's length was not the one announced (Content-Length, or Shard-Length for a chunked
    body): the stream was aborted, or it ran past its length (got is then above want)."""

    def __init__(self, got, want):
        self.got, self.want = got, want
        if got > want:
            super().__init__(f"shardsrv: the body ran past its length of {want} bytes")
        else:
            super().__init__(f"shardsrv: the body ended after {got} of {want} bytes")


class DigestError(Exception):
    """A body whose SHA-256 is not the Repr-Digest the server sent with it: bytes changed between
    the server and here. got and want are RFC 9530 values ("sha-256=:BASE64:"; want is the field as
    sent, a header's and a trailer's joined by "; " when both came). Retried like a short body,
    raised when the attempts run out."""

    def __init__(self, got, want):
        self.got, self.want = got, want
        super().__init__(f"shardsrv: the body's digest is {got}, the server sent {want}: it was damaged in transit")


def _transient(e):
    """Whether another attempt may cure e: overload, storage trouble, a broken connection, a
    body damaged in transit."""
    if isinstance(e, ProblemError):
        return e.retryable
    if isinstance(e, (ShortBodyError, DigestError)):
        return True
    if isinstance(e, urllib.error.URLError):  # HTTPError never gets here: _open makes it a ProblemError
        e = e.reason  # a str for what no retry cures (an unknown URL type)
    if isinstance(e, (ssl.SSLCertVerificationError, http.client.InvalidURL)):
        return False
    return isinstance(e, (OSError, http.client.HTTPException))  # refused, reset, timed out, cut short


def _retry_after(value):
    """Seconds a Retry-After header asks for (seconds or an HTTP date); 0 when absent."""
    if not value:
        return 0.0
    if value.strip().isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return 0.0


def _quote(name):
    return urllib.parse.quote(name, safe="")  # '/' in a checkpoint name goes as %2F


def _length(res):
    """The body's announced length: its Content-Length or, for a chunked body (which carries the
    digest trailer and so cannot have a Content-Length), the server's Shard-Length; -1 if neither."""
    for name in ("Content-Length", "Shard-Length"):
        n = res.headers.get(name)
        if n is not None and n.strip().isascii() and n.strip().isdigit():
            return int(n)
    return -1


# Trailers. The server sends a shard chunked, its SHA-256 in a Repr-Digest trailer field after the
# last chunk. http.client reads the trailer section and drops it, in HTTPResponse's private method
# _read_and_discard_trailer (present, with the same role, in CPython 3.8 through 3.13), and has no
# public way to get it. _TrailerResponse overrides that one hook to keep the fields; everything
# else is http.client's. Connections make their responses from response_class, so the client's
# opener uses connection classes that name it. Should a later Python stop calling the hook, the
# trailer is simply not seen: the body is then checked for its length only, and a warning says so.

class _TrailerResponse(http.client.HTTPResponse):
    """An HTTPResponse that keeps a chunked body's trailer fields in ``trailers`` (an
    http.client.HTTPMessage), set once the body was read to its end; None until then, and for a
    body that is not chunked."""

    trailers = None

    def _read_and_discard_trailer(self):  # overrides a private hook: see above
        trailers = http.client.HTTPMessage()
        count = 0
        while True:
            line = self.fp.readline(http.client._MAXLINE + 1)
            if len(line) > http.client._MAXLINE:
                raise http.client.LineTooLong("trailer line")
            if line in (b"\r\n", b"\n", b""):  # b"": the peer closed without the final CRLF
                break
            count += 1
            if count > http.client._MAXHEADERS:
                raise http.client.HTTPException(f"got more than {http.client._MAXHEADERS} trailer fields")
            name, sep, value = line.decode("iso-8859-1").partition(":")
            if sep and name.strip():
                trailers[name.strip()] = value.strip()
        self.trailers = trailers


class _HTTPConnection(http.client.HTTPConnection):
    response_class = _TrailerResponse


class _HTTPSConnection(http.client.HTTPSConnection):
    response_class = _TrailerResponse


class _HTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class, req, **kw):
        return super().do_open(_HTTPConnection, req, **kw)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    # do_open, not https_open: what https_open passes on differs between Python versions.
    def do_open(self, http_class, req, **kw):
        return super().do_open(_HTTPSConnection, req, **kw)


_warned_no_trailers = False


# RFC 8941's dictionary as internal/sfv parses it (the Go client's parser): keys, bare items
# (integers, decimals, strings, byte sequences, booleans, tokens) and parameters; no inner lists.
_SF_KEY = r"[a-z*][a-z0-9_\-.*]*"
_SF_BARE_ITEM = r"""(?:
    -?[0-9]{1,15}(?![0-9.])                     # an integer
  | -?[0-9]{1,12}\.[0-9]{1,3}(?![0-9])          # a decimal
  | "(?:[ !\#-\[\]-~]|\\["\\])*"                # a string
  | :(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}(?:==)?|[A-Za-z0-9+/]{3}=?)?:  # a byte sequence,
                                                # its base64 padded or not (RFC 8941 asks for both)
  | \?[01]                                      # a boolean
  | [A-Za-z*][A-Za-z0-9!\#$%&'*+\-.^_`|~:/]*    # a token
)"""
_SF_MEMBER = re.compile(rf"({_SF_KEY})(?:=({_SF_BARE_ITEM}))?(?:;\ *{_SF_KEY}(?:={_SF_BARE_ITEM})?)*", re.X)
_SF_SEPARATOR = re.compile(r"[ \t]*(?:\Z|,[ \t]*(?=[a-z*]))")  # another member must follow a comma


def _parse_dictionary(field):
    """An RFC 8941 dictionary's members: each key's byte sequence as bytes, None for a value of
    another type; a later member of a key overrides an earlier one, parameters are dropped. None
    when field is not a dictionary, which RFC 8941 says to ignore whole."""
    members, i = {}, len(field) - len(field.lstrip(" "))
    while i < len(field):
        member = _SF_MEMBER.match(field, i)
        separator = member and _SF_SEPARATOR.match(field, member.end())
        if not separator:
            return None
        key, value = member.groups()
        members[key] = None
        if value and value[0] == ":":
            b64 = value[1:-1]
            members[key] = base64.b64decode(b64 + "=" * (-len(b64) % 4))
        i = separator.end()
    return members


def _check_digest(header, trailer, got):
    """Checks a body whose SHA-256 is got against the Repr-Digest field lines the server sent with
    it: in the header section when it knew the digest before the body, in the trailer otherwise.
    Returns the digest matched ("sha-256=:BASE64:"), or None when neither names sha-256. Raises
    DigestError for a digest other than got, a header and a trailer that name different ones, or a
    field that does not parse, which cannot be checked against (api/testdata/repr_digest.json has
    the cases the Go client checks too)."""
    sent = [", ".join(lines) for lines in (header, trailer) if lines]
    dicts = [_parse_dictionary(field) for field in sent]
    named = [d["sha-256"] for d in dicts if d is not None and "sha-256" in d]
    if not named and None not in dicts:
        return None
    value = "sha-256=:" + base64.b64encode(got).decode() + ":"
    if None in dicts or any(d != got for d in named):
        raise DigestError(value, "; ".join(sent))
    return value


class _Unhashed:
    """The hash of a body whose digest the client declined and the server does not send: SHA-256
    would cost about a core's worth of a fast download for nothing."""

    def update(self, _):
        pass


def _hasher(res, wanted):
    """What a body is hashed into: SHA-256 when the client wants the digest, or when the server
    sends one anyway (a header, or a trailer it announces), which is then checked all the same."""
    announced = "repr-digest" in (res.headers.get("Trailer") or "").lower()
    if wanted or announced or res.headers.get_all("Repr-Digest"):
        return hashlib.sha256()
    return _Unhashed()


def _verify(res, hashed):
    """Checks the body, read to its end and hashed into hashed, against its Repr-Digest header or
    trailer. Returns the digest it matched ("sha-256=:BASE64:"), or None when there was none to
    check: the client declined it, the server sent none, or none names sha-256."""
    global _warned_no_trailers
    if isinstance(hashed, _Unhashed):
        return None
    trailers = getattr(res, "trailers", None)
    if trailers is None and getattr(res, "chunked", False) and not _warned_no_trailers:
        # A chunked body read to its end went through the hook, unless this Python no longer calls it.
        _warned_no_trailers = True
        log.warning("this Python's http.client did not hand over the Repr-Digest trailer: "
                    "bodies are checked for their length only")
    header = res.headers.get_all("Repr-Digest") or []
    trailer = (trailers.get_all("Repr-Digest") if trailers is not None else None) or []
    return _check_digest(header, trailer, hashed.digest())


def _finish(res, done, total):
    """Reads on past the last expected byte: a chunked body's end (and its trailer) come only then."""
    if res.readinto(bytearray(1)):
        raise ShortBodyError(done + 1, total)


def _read_into(res, view, total, progress, hashed):
    """Reads the body straight into view (no intermediate buffer), hashing it as it comes;
    returns the bytes read."""
    if total >= 0:
        view = view[:total]
    done = 0
    while done < len(view):
        n = res.readinto(view[done:done + _CHUNK])
        if not n:
            break
        hashed.update(view[done:done + n])
        done += n
        if progress:
            progress(done, total)
    if total >= 0 and done != total:
        raise ShortBodyError(done, total)
    if done == len(view):
        try:
            _finish(res, done, total)
        except ShortBodyError:
            if total >= 0:
                raise
            raise ValueError(f"shardsrv: the shard is longer than the {len(view)} bytes of the buffer") from None
    return done


def _bytes_of(out):
    """A writable byte view of out's memory, or None when out is not a buffer (a file object)."""
    try:
        view = memoryview(out)
    except TypeError:
        view = _torch_bytes(out)
        if view is None:
            return None
    view = view.cast("B")  # raises TypeError for a buffer that is not contiguous
    if view.readonly:
        raise TypeError("shardsrv: fetch_into needs a writable buffer")
    return view


def _torch_bytes(out):
    """The memory of a CPU torch tensor or storage, which have no buffer protocol
    (pytorch/pytorch#69491): viewed through ctypes, without a copy; None for anything else. A
    tensor's size is numel() * element_size() (torch 1.13 has no Tensor.nbytes), a storage's its
    nbytes()."""
    if not callable(getattr(out, "data_ptr", None)) or not hasattr(out, "device"):
        return None
    is_tensor = callable(getattr(out, "is_contiguous", None))
    if not is_tensor and not callable(getattr(out, "nbytes", None)):
        return None
    if str(out.device) != "cpu":
        raise TypeError(f"shardsrv: fetch_into writes host memory, not {out.device}; "
                        "fetch into a CPU (pinned) buffer and copy")
    if is_tensor and not out.is_contiguous():
        raise TypeError(f"shardsrv: fetch_into needs a contiguous tensor; this one has strides {tuple(out.stride())} "
                        "(fetch into tensor.contiguous() and copy it back)")
    nbytes = out.numel() * out.element_size() if is_tensor else out.nbytes()
    return memoryview((ctypes.c_char * nbytes).from_address(out.data_ptr()))


class Client:
    """A shardsrv client. It retries what another attempt may cure (overload, storage trouble,
    broken connections, a body damaged in transit) with jittered exponential backoff, logging each
    retry on the "shardsrv" logger, and never what cannot succeed (a malformed URL, a request the
    server refuses).

    Every shard is checked against the Repr-Digest the server sends with it, as a trailer or a
    header (SHA-256, hashed while reading). digest=False declines it (Want-Repr-Digest: sha-256=0) for a client that
    measures hashing as too costly: the server may then send local files without copying them, and
    bodies are checked for their length only. Requests go through the client's own urllib opener
    (the standard handlers, proxies from the environment), not one installed with install_opener."""

    def __init__(self, base_url, token=None, attempts=5, backoff=0.5, timeout=600, max_backoff=30.0, digest=True,
                 ca_file=None):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"shardsrv: server {base_url!r} is not a URL such as http://shardsrv:8080")
        self.base_url = base_url.rstrip("/")
        # timeout bounds each connect and each read, not a whole (possibly long) body.
        self.token, self.attempts, self.backoff, self.timeout = token, attempts, backoff, timeout
        self.max_backoff, self.digest = max_backoff, digest
        # ca_file: the PEM CA bundle an https:// server's certificate chains to, instead of the system's.
        context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._opener = urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context=context))  # keeps trailers

    def _open(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        if not self.digest:
            req.add_header("Want-Repr-Digest", "sha-256=0")
        try:
            return self._opener.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            try:
                p = json.loads(e.read() or b"{}")
            except ValueError:
                p = {}
            err = ProblemError(p.get("status", e.code), p.get("title", e.reason), p.get("detail"), p.get("errors"),
                               p.get("type"), p.get("retryable"))
            err.retry_after = e.headers.get("Retry-After")
            raise err from None

    def _retry(self, what, attempt):
        """Runs attempt until it succeeds, fails in a way no retry cures, or the attempts run out.
        Each wait is drawn below a bound that doubles (full jitter), on top of any Retry-After, so
        pods told to back off together do not come back in lockstep."""
        attempts = max(1, self.attempts)  # zero or fewer still sends the request once
        bound = self.backoff
        for n in range(1, attempts + 1):
            try:
                return attempt()
            except Exception as e:
                if n == attempts or not _transient(e):
                    raise
                wait = _retry_after(getattr(e, "retry_after", None)) + random.uniform(0, bound)
                log.warning("retrying %s in %.2fs (attempt %d of %d): %s", what, wait, n + 1, attempts, e)
                time.sleep(wait)
                bound = min(2 * bound, self.max_backoff)

    def _json(self, method, path, body=None):
        def attempt():
            with self._open(method, path, body) as res:
                return json.loads(res.read())
        return self._retry(f"{method} {path}", attempt)

    @staticmethod
    def _request(request, layout, tensors, format):
        """A shard request: request itself (a dict), or a checkpoint name with layout= or tensors=."""
        if isinstance(request, str):
            if (layout is None) == (tensors is None):
                raise ValueError("shardsrv: give a checkpoint name with layout= or tensors=")
            request = {"checkpoint": request, **({"layout": layout} if layout is not None else {"tensors": tensors})}
        elif layout is not None or tensors is not None:
            raise ValueError("shardsrv: layout= and tensors= go with a checkpoint name, not with a request")
        return request if format is None else dict(request, format=format)

    def checkpoints(self):
        return self._json("GET", "/v1/checkpoints")["checkpoints"]

    def tensors(self, checkpoint):
        """Lists a checkpoint's tensors ({"checkpoint", "tensors": [...]}), following the pages."""
        query = {"checkpoint": checkpoint}
        out = None
        while True:
            page = self._json("GET", "/v1/tensors?" + urllib.parse.urlencode(query))
            if out is None:
                out = page
            else:
                out["tensors"] += page["tensors"]
            token = page.get("next_page_token")
            if not token:
                out.pop("next_page_token", None)
                return out
            query["page_token"] = token

    def layout(self, checkpoint, layout):
        """The explicit tensors table an engine's rank expands to (POST /v1/layouts): a list to send
        as ``tensors``, as it is or edited. layout is e.g. {"engine": "vllm", "tensor_parallel_size":
        8, "tp_rank": 3}, with the optional fields of docs/engines.md ("engine_version", "enable_expert_parallel",
        "data_parallel_size", "dp_rank", "dtype", vLLM's "prefill_context_parallel_size", "pcp_rank",
        "enable_eplb", "num_redundant_experts", "expert_placement_strategy"), sent as they are."""
        return self._json("POST", "/v1/layouts", {"checkpoint": checkpoint, "layout": layout})["tensors"]

    def files(self, checkpoint):
        """A checkpoint's small files (config.json, tokenizer files, ...): [{"name", "size"}]."""
        return self._json("GET", f"/v1/checkpoints/{_quote(checkpoint)}/files")["files"]

    def file(self, checkpoint, name):
        """One of a checkpoint's small files, as a bytearray."""
        return self._download("GET", f"/v1/checkpoints/{_quote(checkpoint)}/files/{_quote(name)}", None, None)[0]

    def plan(self, request, *, layout=None, tensors=None, format=None):
        return self._json("POST", "/v1/plan", self._request(request, layout, tensors, format))

    def fetch(self, request, progress=None, *, layout=None, tensors=None, format=None):
        """Returns a whole shard as a bytearray, held once: read straight into a buffer of the
        body's length. request is a request dict, or a checkpoint name with layout= or tensors=.
        The body is checked against its digest; fetch_verified returns the digest too."""
        return self.fetch_verified(request, None, progress, layout=layout, tensors=tensors, format=format)[0]

    def fetch_verified(self, request, out=None, progress=None, *, layout=None, tensors=None, format=None):
        """Fetches a shard as fetch (out None), fetch_into (out a buffer or a binary file object)
        or fetch_to_file (out a path: a str or os.PathLike) do, and returns a pair: what that
        returns (the bytearray, or the byte count) and the digest the body was checked against,
        "sha-256=:BASE64:" (RFC 9530), or None when there was none to check (digest=False, or a
        server that sends none). A body that does not match it raises DigestError, after retries."""
        request = self._request(request, layout, tensors, format)
        if out is None:
            return self._download("POST", "/v1/shards", request, progress)
        if isinstance(out, (str, os.PathLike)):
            with open(out, "w+b") as f:
                return self._fetch_into(request, f, progress)
        return self._fetch_into(request, out, progress)

    def _download(self, method, path, body, progress):
        """The body of a response, as a bytearray, and the digest it matched (or None)."""
        def attempt():
            with self._open(method, path, body) as res:
                hashed = _hasher(res, self.digest)
                total = _length(res)
                if total >= 0:
                    buf = bytearray(total)
                    _read_into(res, memoryview(buf), total, progress, hashed)
                    return buf, _verify(res, hashed)
                buf = bytearray()  # no length: grow as it comes
                while chunk := res.read(_CHUNK):
                    hashed.update(chunk)
                    buf += chunk
                    if progress:
                        progress(len(buf), total)
                return buf, _verify(res, hashed)
        return self._retry(f"{method} {path}", attempt)

    def fetch_into(self, request, out, progress=None, *, layout=None, tensors=None, format=None):
        """Streams a shard into out and returns the byte count. out is any writable buffer — a
        bytearray, a memoryview, an array, a numpy array, mmap, a contiguous CPU torch tensor or
        UntypedStorage — filled from its start straight from the socket (no intermediate copy), or
        a binary file object, written from its position (a retry after bytes were written rewinds
        it, so it must be seekable for that). The body is checked against its digest; a mismatch
        is retried like a broken body (so a buffer may hold damaged bytes until a retry overwrites
        them). fetch_verified returns the digest too."""
        return self._fetch_into(self._request(request, layout, tensors, format), out, progress)[0]

    def _fetch_into(self, request, out, progress):
        view = _bytes_of(out)
        if view is None:
            return self._fetch_to_file(request, out, progress)

        def attempt():  # a retry simply overwrites the buffer from its start
            with self._open("POST", "/v1/shards", request) as res:
                total = _length(res)
                if total > len(view):
                    raise ValueError(f"shardsrv: the shard is {total} bytes; the buffer holds {len(view)}")
                hashed = _hasher(res, self.digest)
                n = _read_into(res, view, total, progress, hashed)
                return n, _verify(res, hashed)
        return self._retry("POST /v1/shards", attempt)

    def _fetch_to_file(self, request, out, progress):
        start = out.tell() if out.seekable() else None
        chunk = memoryview(bytearray(_CHUNK))
        written = 0

        def attempt():
            nonlocal written
            if written:  # a failed attempt left bytes behind: start over
                out.seek(start)
                out.truncate()
                written = 0
            try:
                with self._open("POST", "/v1/shards", request) as res:
                    total = _length(res)
                    hashed = _hasher(res, self.digest)
                    while n := res.readinto(chunk):
                        out.write(chunk[:n])
                        hashed.update(chunk[:n])
                        written += n
                        if progress:
                            progress(written, total)
                    if total >= 0 and written != total:
                        raise ShortBodyError(written, total)
                    return written, _verify(res, hashed)
            except Exception as e:
                if written and start is None and _transient(e):
                    raise RuntimeError(f"{e}; not retried: {written} bytes were written and the output cannot "
                                       "start over") from e
                raise
        return self._retry("POST /v1/shards", attempt)

    def fetch_into_parts(self, request, nbytes, parts):
        """Streams a raw shard of nbytes into a sequence of buffers, in order, and returns the
        digest it was checked against (or None). parts() gives, for each attempt, an iterable of
        (view, filled): a writable byte memoryview, filled from the socket with no intermediate
        copy, and a callable (or None) called once view holds its bytes (to copy them on, say to a
        GPU); the views hold nbytes together. A retry starts over from the first part, so filled
        runs again for the bytes of the new attempt."""
        def attempt():
            with self._open("POST", "/v1/shards", request) as res:
                total = _length(res)
                if total >= 0 and total != nbytes:
                    raise ValueError(f"shardsrv: the shard is {total} bytes, not the {nbytes} its parts hold")
                total = nbytes
                hashed = _hasher(res, self.digest)
                done = 0
                for view, filled in parts():
                    n = len(view)
                    got = 0
                    while got < n:
                        k = res.readinto(view[got:got + _CHUNK])
                        if not k:
                            raise ShortBodyError(done + got, total)
                        hashed.update(view[got:got + k])
                        got += k
                    done += n
                    if filled:
                        filled()
                if done != total:
                    raise ValueError(f"shardsrv: the parts hold {done} bytes, not {total}")
                _finish(res, done, total)
                return _verify(res, hashed)
        return self._retry("POST /v1/shards", attempt)

    def fetch_to_file(self, request, path, progress=None, *, layout=None, tensors=None, format=None):
        """Writes a shard to the file at path (created or truncated) and returns the byte count.
        The body is checked against its digest; fetch_verified returns the digest too."""
        with open(path, "w+b") as f:
            return self._fetch_into(self._request(request, layout, tensors, format), f, progress)[0]


def parse_safetensors(data):
    """Parses a safetensors body: returns ({name: (dtype, shape, memoryview)}, metadata)."""
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(bytes(data[8:8 + n]))
    meta = header.pop("__metadata__", {})
    view, start = memoryview(data), 8 + n
    tensors = {name: (t["dtype"], t["shape"], view[start + t["data_offsets"][0]:start + t["data_offsets"][1]])
               for name, t in header.items()}
    return tensors, meta


def to_numpy(buf, dtype, shape):
    """A numpy array over raw bytes (BF16 and FP8 come back as uint16 / uint8 bit patterns)."""
    import numpy as np
    np_dtype = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
                "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16,
                "BF16": np.uint16, "F32": np.float32, "F64": np.float64, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
                "F8_E8M0": np.uint8}[dtype]
    return np.frombuffer(buf, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape)


# torch dtype attribute names, looked up only when used: FP8 arrived in torch 2.1 and the wide
# unsigned integers in 2.3, and an older torch must still convert everything else.
_TORCH_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
                 "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
                 "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                 "F8_E8M0": "float8_e8m0fnu"}


def to_torch(buf, dtype, shape):
    """A torch tensor over raw bytes, in the tensor's own dtype. It shares buf when buf is writable
    (what fetch returns), and copies it otherwise."""
    import torch
    name = _TORCH_DTYPES[dtype]
    t_dtype = getattr(torch, name, None)
    if t_dtype is None:
        raise TypeError(f"shardsrv: torch {getattr(torch, '__version__', '?')} has no torch.{name} for {dtype}; "
                        "upgrade torch, or use to_numpy for the bit patterns")
    view = memoryview(buf)
    if view.nbytes == 0:
        return torch.empty(shape, dtype=t_dtype)
    if view.readonly:
        view = bytearray(view)
    return torch.frombuffer(view, dtype=t_dtype).reshape(shape)
