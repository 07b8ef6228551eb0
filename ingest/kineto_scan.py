"""Compiled scanner for Chrome-trace / Kineto JSON: bytes in, columns out.

Why not ``json.load``: a 1 GB trace becomes tens of millions of Python objects (several GB) and
takes minutes. This scanner walks the bytes once with a small state machine compiled by numba and
writes only the fields the activity tables need into preallocated column arrays, one batch of
events at a time, so memory grows with the tables and not with the JSON. Nesting is tracked with a
counter (no recursion), so a hostile file cannot overflow the stack.

Layout of one batch (``B`` events):
  ints[NI, B]  int64 values, ipres[B, NI] 1 where present (one row per event: cleared per event)
  sdata[NS, CAP] bytes of decoded strings per string column, soffs[NS, B + 1] Arrow-style offsets,
  spres[B, NS] 1 where present
Times are converted from microseconds to integer nanoseconds exactly from the decimal digits
(no float rounding) unless the number has an exponent.

How it is compiled matters more than the state machine: ``scan`` is one function in which an
event's members and those of its args are parsed in line (small helpers are inlined), so the
batch's arrays are bound once per call; everything is compiled with ``_nrt=False``, without
numba's reference counting, since otherwise each helper took and dropped a reference to every
array it was handed (atomic operations, per field: about half of the time of the scanner this
one replaced). So nothing here may allocate an array. Indices are unsigned (``_U``), which
leaves out the code for negative indices.
"""

from __future__ import annotations

import numpy as np

from daydream.base.compiled import helper, kernel

_U = np.uint64  # array indices: unsigned, so no negative-index wraparound is compiled in

# ---- int columns -------------------------------------------------------------------------------
I_PH, I_PID, I_TID, I_TS, I_DUR, I_ID, I_BP = range(7)
(I_EXT, I_CORR, I_DEV, I_CTX, I_STREAM, I_BYTES, I_CBID, I_REGS, I_SHMEM, I_SEQ, I_FWDTID,
 I_PYID, I_PYPAR, I_WSTREAM, I_WEVCORR, I_WEVID, I_INEL, I_OUTEL, I_GROUP) = range(7, 26)
I_GRID = 26   # 26, 27, 28
I_BLOCK = 29  # 29, 30, 31
# the allocator's records ("[memory]" instant events)
I_MEMBYTES, I_MEMALLOC, I_MEMRES, I_MEMDEV, I_MEMDEVTYPE = range(32, 37)
NI = 37

# ---- string columns ----------------------------------------------------------------------------
(S_CAT, S_NAME, S_PID, S_TID, S_COLL, S_DTYPE, S_PG, S_SYNCKIND, S_KIND, S_ARGNAME, S_INDIMS,
 S_INTYPE) = range(12)
NS = 12

# ---- keys --------------------------------------------------------------------------------------
# top-level event keys -> field id
K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ID, K_BP, K_ARGS = range(10)
TOP_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "args"]

# args keys: (key, kind, slot). kind 0 numeric -> ints slot, 1 string -> string column,
# 2 raw JSON text -> string column, 3 array of up to 3 ints -> ints slots slot..slot+2,
# 4 numeric, lenient: a value of another type (true, an object) is counted and left null
# instead of failing the trace (the allocator's records, which no graph needs: ingest
# counts a damaged one and skips it)
ARG_KEYS = [
    ("External id", 0, I_EXT), ("external id", 0, I_EXT), ("correlation", 0, I_CORR),
    ("device", 0, I_DEV), ("context", 0, I_CTX), ("stream", 0, I_STREAM), ("bytes", 0, I_BYTES),
    ("cbid", 0, I_CBID), ("registers per thread", 0, I_REGS), ("shared memory", 0, I_SHMEM),
    ("Sequence number", 0, I_SEQ), ("Fwd thread id", 0, I_FWDTID), ("Python id", 0, I_PYID),
    ("Python parent id", 0, I_PYPAR), ("wait_on_stream", 0, I_WSTREAM),
    ("wait_on_cuda_event_record_corr_id", 0, I_WEVCORR), ("wait_on_cuda_event_id", 0, I_WEVID),
    ("In msg nelems", 0, I_INEL), ("Out msg nelems", 0, I_OUTEL), ("Group size", 0, I_GROUP),
    ("grid", 3, I_GRID), ("block", 3, I_BLOCK),
    ("Collective name", 1, S_COLL), ("dtype", 1, S_DTYPE), ("Process Group Name", 1, S_PG),
    ("cuda_sync_kind", 1, S_SYNCKIND), ("kind", 1, S_KIND), ("name", 1, S_ARGNAME),
    ("Input Dims", 2, S_INDIMS), ("Input type", 2, S_INTYPE),
    ("Bytes", 4, I_MEMBYTES), ("Total Allocated", 4, I_MEMALLOC),
    ("Total Reserved", 4, I_MEMRES), ("Device Id", 4, I_MEMDEV),
    ("Device Type", 4, I_MEMDEVTYPE),
]
ARG_FIELD_BASE = 100  # field ids of args keys in error reports: ARG_FIELD_BASE + index


def _key_table(keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    enc = [k.encode() for k in keys]
    offs = np.zeros(len(enc) + 1, np.int64)
    offs[1:] = np.cumsum([len(k) for k in enc])
    return np.frombuffer(b"".join(enc), np.uint8).copy(), offs


TOP_TAB, TOP_OFFS = _key_table(TOP_KEYS)
ARG_TAB, ARG_OFFS = _key_table([k for k, _, _ in ARG_KEYS])
ARG_SLOT = np.array([s for _, _, s in ARG_KEYS], np.int64)

# ---- results and errors ------------------------------------------------------------------------
R_POS, R_STATE, R_N, R_ERR, R_ERRPOS, R_ERRFIELD, R_NMETA, R_TOPOBJ, R_SAWEV, R_FULL = range(10)
NR = 10
ST_START, ST_TOPKEY, ST_EVENTS, ST_DONE = range(4)

E_OK = 0
E_EOF = 1          # unexpected end of input
E_SYNTAX = 2       # malformed JSON
E_TYPE_NUM = 3     # expected a number
E_TYPE_STR = 4     # expected a string
E_TYPE_OBJ = 5     # expected an object
E_DEPTH = 6        # nested too deep
E_RANGE = 7        # number out of range
E_NOTTRACE = 8     # top level is not an object or array
E_BIGEVENT = 9     # one event larger than the string buffers
E_EMPTY = 10       # nothing but whitespace
E_TYPE_NUMSTR = 11  # expected a number or a string
E_BADSTR = 12      # bad escape in a string
E_TRAILING = 13    # data after the end of the document
E_MORE = 14        # (partial buffers only) the buffer ends mid-document: call again with more

MAX_DEPTH = 512
_TRACE_EVENTS = tuple(b"traceEvents")
FIELD_NONE = -1
FIELD_EVENT = -2   # the event itself

# counters (cumulative across batches): strings that were not numbers, per int slot
C_NONNUM = 0  # C_NONNUM + slot
NC = NI


# ---- key lookup --------------------------------------------------------------------------------
# What the scanner does with a key's value. Top-level keys and args keys each have a table of
# (action, slot) by key index; a key not in the table is skipped.
A_SKIP, A_PH, A_STR, A_PIDTID, A_NS, A_IDLIKE, A_BP, A_ARGS = range(8)
A_ARGINT, A_ARGSTR, A_RAW, A_ARR3, A_ARGNUM = range(8, 13)

TOP_ACT = np.array([A_PH, A_STR, A_STR, A_PIDTID, A_PIDTID, A_NS, A_NS, A_IDLIKE, A_BP, A_ARGS],
                   np.int64)
TOP_SLOT = np.array([I_PH, S_CAT, S_NAME, I_PID, I_TID, I_TS, I_DUR, I_ID, I_BP, 0], np.int64)
TOP_COL = np.array([0, 0, 0, S_PID, S_TID, 0, 0, 0, 0, 0], np.int64)  # pid/tid as strings
ARG_ACT = np.array([(A_ARGINT, A_ARGSTR, A_RAW, A_ARR3, A_ARGNUM)[k] for _, k, _ in ARG_KEYS],
                   np.int64)

# Keys are found by a perfect hash of (length, first byte, last byte) into HASH_SIZE slots,
# then compared byte by byte: one probe per key instead of a walk over the table.
HASH_SIZE = 256


def _hash(klen: int, first: int, last: int, mul: tuple[int, int, int]) -> int:
    return (klen * mul[0] + first * mul[1] + last * mul[2]) & (HASH_SIZE - 1)


def _perfect_hash(keys: list[str]) -> tuple[np.ndarray, tuple[int, int, int]]:
    """A slot -> key index table (-1: no key) and the multipliers under which no two keys
    share a slot; the first such multipliers in a fixed order, so the table never changes."""
    for m0 in range(1, 64):
        for m1 in range(1, 64):
            for m2 in (1, 3, 5, 7, 11, 13):
                mul = (m0, m1, m2)
                slots = [_hash(len(k), k.encode()[0], k.encode()[-1], mul) for k in keys]
                if len(set(slots)) == len(slots):
                    tab = np.full(HASH_SIZE, -1, np.int64)
                    tab[slots] = np.arange(len(keys))
                    return tab, mul
    raise AssertionError("no perfect hash for the scanner's keys")  # pragma: no cover


TOP_HASH, TOP_MUL = _perfect_hash(TOP_KEYS)
ARG_HASH, ARG_MUL = _perfect_hash([k for k, _, _ in ARG_KEYS])
_T0, _T1, _T2 = TOP_MUL
_A0, _A1, _A2 = ARG_MUL


@helper(nogil=True, _nrt=False, inline="always")
def _ws(buf, p, n):
    while p < n:
        c = buf[_U(p)]
        if c == 32 or c == 10 or c == 13 or c == 9:
            p += 1
        else:
            break
    return p


@helper(nogil=True, _nrt=False, inline="always")
def _skip_string(buf, p, n):
    # p at opening quote; returns index after closing quote, or -1 at end of input
    p += 1
    while p < n:
        c = buf[_U(p)]
        if c == 92:
            p += 2
        elif c == 34:
            return p + 1
        else:
            p += 1
    return -1


@helper(nogil=True, _nrt=False)
def _skip_value(buf, p, n):
    """Skip one JSON value starting at p. Returns (new p, error)."""
    if p >= n:
        return p, E_EOF
    c = buf[_U(p)]
    if c == 34:
        q = _skip_string(buf, p, n)
        if q < 0:
            return n, E_EOF
        return q, E_OK
    if c == 123 or c == 91:
        depth = 0
        while p < n:
            c = buf[_U(p)]
            if c == 34:
                q = _skip_string(buf, p, n)
                if q < 0:
                    return n, E_EOF
                p = q
            elif c == 123 or c == 91:
                depth += 1
                if depth > MAX_DEPTH:
                    return p, E_DEPTH
                p += 1
            elif c == 125 or c == 93:
                depth -= 1
                p += 1
                if depth == 0:
                    return p, E_OK
            else:
                p += 1
        return n, E_EOF
    # scalar: number or literal
    if not ((48 <= c <= 57) or c == 45 or c == 116 or c == 102 or c == 110):
        return p, E_SYNTAX
    while p < n:
        c = buf[_U(p)]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            return p, E_OK
        p += 1
    return n, E_EOF


@helper(nogil=True, _nrt=False, inline="always")
def _parse_number(buf, p, n):
    """Parse a JSON number. Returns (p, err, neg, ip, frac, fdigits, exp, has_exp)."""
    neg = False
    if p < n and buf[_U(p)] == 45:
        neg = True
        p += 1
    ip = 0
    nd = 0
    while p < n and 48 <= buf[_U(p)] <= 57:
        if nd >= 18:
            return p, E_RANGE, neg, 0, 0, 0, 0, False
        ip = ip * 10 + (buf[_U(p)] - 48)
        nd += 1
        p += 1
    if nd == 0:
        return p, E_SYNTAX, neg, 0, 0, 0, 0, False
    frac = 0
    fd = 0
    if p < n and buf[_U(p)] == 46:
        p += 1
        while p < n and 48 <= buf[_U(p)] <= 57:
            if fd < 9:
                frac = frac * 10 + (buf[_U(p)] - 48)
                fd += 1
            p += 1
    exp = 0
    has_exp = False
    if p < n and (buf[_U(p)] == 101 or buf[_U(p)] == 69):
        has_exp = True
        p += 1
        eneg = False
        if p < n and (buf[_U(p)] == 45 or buf[_U(p)] == 43):
            eneg = buf[_U(p)] == 45
            p += 1
        ed = 0
        while p < n and 48 <= buf[_U(p)] <= 57:
            if ed < 4:
                exp = exp * 10 + (buf[_U(p)] - 48)
            ed += 1
            p += 1
        if ed == 0:
            return p, E_SYNTAX, neg, 0, 0, 0, 0, False
        if eneg:
            exp = -exp
    if p >= n:
        return p, E_EOF, neg, 0, 0, 0, 0, False
    return p, E_OK, neg, ip, frac, fd, exp, has_exp


@helper(nogil=True, _nrt=False, inline="always")
def _pow10(k):
    r = 1
    for _ in range(k):
        r *= 10
    return r


@helper(nogil=True, _nrt=False, inline="always")
def _to_ns(neg, ip, frac, fd, exp, has_exp):
    """Microseconds given as decimal digits -> integer nanoseconds, rounded half up."""
    if has_exp:
        v = (ip + frac / _pow10(fd)) * (10.0 ** exp) * 1000.0
        if v > 9.0e18:
            return 0, E_RANGE
        ns = np.int64(v + 0.5)
    else:
        if ip > 9_000_000_000_000_000:  # ns would overflow int64
            return 0, E_RANGE
        if fd <= 3:
            f3 = frac * _pow10(3 - fd)
        else:
            d = _pow10(fd - 3)
            f3 = frac // d
            if 2 * (frac % d) >= d:
                f3 += 1
        ns = ip * 1000 + f3
    if neg:
        ns = -ns
    return ns, E_OK


@helper(nogil=True, _nrt=False, inline="always")
def _to_int(neg, ip, frac, fd, exp, has_exp):
    if has_exp:
        v = (ip + frac / _pow10(fd)) * (10.0 ** exp)
        if v > 9.0e18:
            return 0, E_RANGE
        r = np.int64(v)
    else:
        r = ip
    if neg:
        r = -r
    return r, E_OK


@helper(nogil=True, _nrt=False, inline="always")
def _digits_in_string(buf, p, n):
    """For a string value at p (opening quote): if it holds a plain decimal integer, return
    (end p, True, value); else (end p, False, 0). End p is -1 at end of input."""
    q = _skip_string(buf, p, n)
    if q < 0:
        return -1, False, 0
    s = p + 1
    e = q - 1
    if e <= s or e - s > 18:
        return q, False, 0
    neg = False
    if buf[_U(s)] == 45:
        neg = True
        s += 1
        if s >= e:
            return q, False, 0
    v = 0
    for i in range(s, e):
        c = buf[_U(i)]
        if c < 48 or c > 57:
            return q, False, 0
        v = v * 10 + (c - 48)
    if neg:
        v = -v
    return q, True, v


@helper(nogil=True, _nrt=False, inline="always")
def _put_utf8(out, col, o, cp):
    if cp < 0x80:
        out[_U(col), _U(o)] = cp
        return o + 1
    if cp < 0x800:
        out[_U(col), _U(o)] = 0xC0 | (cp >> 6)
        out[_U(col), _U(o + 1)] = 0x80 | (cp & 0x3F)
        return o + 2
    if cp < 0x10000:
        out[_U(col), _U(o)] = 0xE0 | (cp >> 12)
        out[_U(col), _U(o + 1)] = 0x80 | ((cp >> 6) & 0x3F)
        out[_U(col), _U(o + 2)] = 0x80 | (cp & 0x3F)
        return o + 3
    out[_U(col), _U(o)] = 0xF0 | (cp >> 18)
    out[_U(col), _U(o + 1)] = 0x80 | ((cp >> 12) & 0x3F)
    out[_U(col), _U(o + 2)] = 0x80 | ((cp >> 6) & 0x3F)
    out[_U(col), _U(o + 3)] = 0x80 | (cp & 0x3F)
    return o + 4


@helper(nogil=True, _nrt=False, inline="always")
def _hex4(buf, p, n):
    if p + 4 > n:
        return -1
    v = 0
    for i in range(4):
        c = buf[_U(p + i)]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return -2
        v = v * 16 + d
    return v


@helper(nogil=True, _nrt=False, inline="always")
def _copy_string(buf, p, n, out, col, o, cap):
    """Decode the JSON string at p (opening quote) into out[col, o:]. Returns (p, o, err);
    err -1 means the output buffer is full."""
    p += 1
    while p < n:
        c = buf[_U(p)]
        if o + 4 >= cap:
            return p, o, -1
        if c == 34:
            return p + 1, o, E_OK
        if c != 92:
            out[_U(col), _U(o)] = c
            o += 1
            p += 1
            continue
        if p + 1 >= n:
            return n, o, E_EOF
        e = buf[_U(p + 1)]
        p += 2
        if e == 110:
            out[_U(col), _U(o)] = 10
        elif e == 116:
            out[_U(col), _U(o)] = 9
        elif e == 114:
            out[_U(col), _U(o)] = 13
        elif e == 98:
            out[_U(col), _U(o)] = 8
        elif e == 102:
            out[_U(col), _U(o)] = 12
        elif e == 34 or e == 92 or e == 47:
            out[_U(col), _U(o)] = e
        elif e == 117:
            cp = _hex4(buf, p, n)
            if cp == -1:
                return n, o, E_EOF
            if cp < 0:
                return p, o, E_BADSTR
            p += 4
            if 0xD800 <= cp < 0xDC00 and p + 6 <= n and buf[_U(p)] == 92 and buf[_U(p + 1)] == 117:
                lo = _hex4(buf, p + 2, n)
                if 0xDC00 <= lo < 0xE000:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    p += 6
            if 0xD800 <= cp < 0xE000:
                cp = 0xFFFD  # lone surrogate: replacement character
            o = _put_utf8(out, col, o, cp)
            continue
        else:
            return p, o, E_BADSTR
        o += 1
    return n, o, E_EOF


@helper(nogil=True, _nrt=False, inline="always")
def _lookup(buf, ks, klen, top):
    """Index of the key buf[ks:ks+klen] among the top-level keys (``top``) or the args keys,
    else -1."""
    if klen <= 0:
        return -1
    first = np.int64(buf[_U(ks)])
    last = np.int64(buf[_U(ks + klen - 1)])
    if top:
        k = TOP_HASH[_U((klen * _T0 + first * _T1 + last * _T2) & (HASH_SIZE - 1))]
        if k < 0:
            return -1
        a = TOP_OFFS[_U(k)]
        if TOP_OFFS[_U(k + 1)] - a != klen:
            return -1
        for i in range(klen):
            if buf[_U(ks + i)] != TOP_TAB[_U(a + i)]:
                return -1
        return k
    k = ARG_HASH[_U((klen * _A0 + first * _A1 + last * _A2) & (HASH_SIZE - 1))]
    if k < 0:
        return -1
    a = ARG_OFFS[_U(k)]
    if ARG_OFFS[_U(k + 1)] - a != klen:
        return -1
    for i in range(klen):
        if buf[_U(ks + i)] != ARG_TAB[_U(a + i)]:
            return -1
    return k


@kernel("int64", "readonly uint8[::1]", "int64[::1]", "int64[:, ::1]", "uint8[:, ::1]",
        "uint8[:, ::1]", "int64[:, ::1]", "uint8[:, ::1]", "int64[::1]", "int64[:, ::1]", "bool",
        "int64", nogil=True, _nrt=False)
def scan(buf, res, ints, ipres, sdata, soffs, spres, counters, meta, partial, start):
    """Scan from res[R_POS] in state res[R_STATE] until the batch is full or the document ends,
    writing events from row ``start`` of the batch on (rows before it were filled by an earlier
    call: the batch's buffers were full and have been grown). res[R_FULL] says why a call
    stopped early: 1 no row left, 2 no room left for strings.

    With ``partial`` set, ``buf`` is the part of the document inflated so far: running out of
    input returns E_MORE with the position rolled back to the start of the unfinished event (or
    top-level key), to be called again once there is more. Runs without the GIL, so inflating
    the rest of the file goes on in another thread meanwhile.

    On return res holds the new position and state, the number of events in this batch, and an
    error code with its byte position and field id. meta[i] = (key start, key end, value start,
    value end) of the top-level keys other than traceEvents (res[R_NMETA] of them).

    One function, the event's members and its args parsed in line: the batch's arrays are
    bound once per call, so nothing is reference-counted per event or per field."""
    n = buf.shape[0]
    bmax = ints.shape[1]
    cap = sdata.shape[1]
    p = res[_U(R_POS)]
    state = res[_U(R_STATE)]
    nev = start
    errfield = FIELD_NONE
    if start == 0:
        for c in range(NS):
            soffs[_U(c), _U(0)] = 0
    res[_U(R_ERR)] = E_OK
    res[_U(R_FULL)] = 0
    p_safe = p
    state_safe = state
    while True:
        p_safe = p
        state_safe = state
        if state == ST_START:
            p = _ws(buf, p, n)
            if p >= n:
                res[_U(R_ERR)] = E_EMPTY
                break
            c = buf[_U(p)]
            if c == 123:
                res[_U(R_TOPOBJ)] = 1
                state = ST_TOPKEY
                p += 1
            elif c == 91:
                res[_U(R_TOPOBJ)] = 0
                state = ST_EVENTS
                p += 1
            else:
                res[_U(R_ERR)] = E_NOTTRACE
                break
        elif state == ST_TOPKEY:
            p = _ws(buf, p, n)
            if p >= n:
                res[_U(R_ERR)] = E_EOF
                break
            c = buf[_U(p)]
            if c == 125:
                p += 1
                state = ST_DONE
                continue
            if c == 44:
                p += 1
                continue
            if c != 34:
                res[_U(R_ERR)] = E_SYNTAX
                break
            ks = p + 1
            q = _skip_string(buf, p, n)
            if q < 0:
                res[_U(R_ERR)] = E_EOF
                p = n
                break
            ke = q - 1
            p = _ws(buf, q, n)
            if p >= n or buf[_U(p)] != 58:
                res[_U(R_ERR)] = E_EOF if p >= n else E_SYNTAX
                break
            p = _ws(buf, p + 1, n)
            is_events = ke - ks == 11
            if is_events:
                for i in range(11):
                    if buf[_U(ks + i)] != _TRACE_EVENTS[i]:
                        is_events = False
                        break
            if is_events and p < n and buf[_U(p)] == 91:
                res[_U(R_SAWEV)] = 1
                p += 1
                state = ST_EVENTS
                continue
            vs = p
            p, err = _skip_value(buf, p, n)
            if err != E_OK:
                res[_U(R_ERR)] = err
                break
            m = res[_U(R_NMETA)]
            if m < meta.shape[0]:
                meta[_U(m), _U(0)] = ks
                meta[_U(m), _U(1)] = ke
                meta[_U(m), _U(2)] = vs
                meta[_U(m), _U(3)] = p
                res[_U(R_NMETA)] = m + 1
        elif state == ST_EVENTS:
            p = _ws(buf, p, n)
            if p >= n:
                res[_U(R_ERR)] = E_EOF
                break
            c = buf[_U(p)]
            if c == 93:
                p += 1
                state = ST_TOPKEY if res[_U(R_TOPOBJ)] == 1 else ST_DONE
                continue
            if c == 44:
                p += 1
                continue
            if c != 123:
                errfield = FIELD_EVENT
                res[_U(R_ERR)] = E_TYPE_OBJ
                break
            if nev >= bmax:
                res[_U(R_FULL)] = 1
                break
            ev = nev
            for j in range(NS):
                spres[_U(ev), _U(j)] = 0
                soffs[_U(j), _U(ev + 1)] = soffs[_U(j), _U(ev)]
            for j in range(NI):
                ipres[_U(ev), _U(j)] = 0
            p0 = p
            # ---- one event: its members, and those of its args object, in one loop ----
            err = E_OK
            in_args = False
            expect_end = False  # after a value: ',' or '}' next
            p = _ws(buf, p + 1, n)
            if p >= n:
                p = n
                err = E_EOF
            elif buf[_U(p)] == 125:
                p += 1
            else:
                while True:
                    if expect_end:
                        p = _ws(buf, p, n)
                        if p >= n:
                            p = n
                            err = E_EOF
                            break
                        c = buf[_U(p)]
                        if c == 44:
                            p += 1
                            expect_end = False
                            continue
                        if c == 125:
                            p += 1
                            if in_args:  # the args object ends: so does the "args" member
                                in_args = False
                                errfield = FIELD_NONE
                                continue
                            break
                        err = E_SYNTAX
                        break
                    # "key":
                    p = _ws(buf, p, n)
                    if p >= n:
                        p = n
                        err = E_EOF
                        break
                    if buf[_U(p)] != 34:
                        err = E_SYNTAX
                        break
                    kstart = p + 1
                    q = _skip_string(buf, p, n)
                    if q < 0:
                        p = n
                        err = E_EOF
                        break
                    p = _ws(buf, q, n)
                    if p >= n:
                        p = n
                        err = E_EOF
                        break
                    if buf[_U(p)] != 58:
                        err = E_SYNTAX
                        break
                    p = _ws(buf, p + 1, n)
                    if p >= n:
                        p = n
                        err = E_EOF
                        break
                    c = buf[_U(p)]
                    k = _lookup(buf, kstart, q - 1 - kstart, not in_args)
                    slot = 0
                    if in_args:
                        if k < 0:
                            act = A_SKIP
                        else:
                            errfield = ARG_FIELD_BASE + k
                            act = ARG_ACT[_U(k)]
                            slot = ARG_SLOT[_U(k)]
                    else:
                        errfield = k
                        if k < 0:
                            act = A_SKIP
                        else:
                            act = TOP_ACT[_U(k)]
                            slot = TOP_SLOT[_U(k)]
                    # the value: each action either finishes it here, or names what to do
                    num_slot = -1   # parse a number into ints[_U(num_slot)]
                    as_ns = False   # ... converting microseconds to nanoseconds
                    str_col = -1    # copy a string into string column str_col
                    skip = False    # skip the value
                    if act == A_SKIP:
                        skip = True
                    elif act == A_PH:
                        if c != 34:
                            err = E_TYPE_STR
                            break
                        if p + 1 < n:
                            ints[_U(I_PH), _U(ev)] = buf[_U(p + 1)]
                            ipres[_U(ev), _U(I_PH)] = 1
                        q = _skip_string(buf, p, n)
                        if q < 0:
                            p = n
                            err = E_EOF
                            break
                        p = q
                    elif act == A_STR:  # cat, name
                        if c == 34:
                            str_col = slot
                        elif c == 110:
                            skip = True
                        else:
                            err = E_TYPE_STR
                            break
                    elif act == A_NS:  # ts, dur
                        if (48 <= c <= 57) or c == 45:
                            num_slot = slot
                            as_ns = True
                        elif c == 110:
                            skip = True
                        else:
                            err = E_TYPE_NUM
                            break
                    elif (act == A_PIDTID or act == A_IDLIKE or act == A_ARGINT
                          or act == A_ARGNUM):
                        # integers, given as a number or as a string of digits (old Kineto
                        # writes ids both ways)
                        if (48 <= c <= 57) or c == 45:
                            num_slot = slot
                        elif c == 34:
                            q, ok, v = _digits_in_string(buf, p, n)
                            if q < 0:
                                p = n
                                err = E_EOF
                                break
                            if ok:
                                ints[_U(slot), _U(ev)] = v
                                ipres[_U(ev), _U(slot)] = 1
                                p = q
                            elif act == A_PIDTID:  # "stream 7", "Spans": kept as a string
                                str_col = TOP_COL[_U(k)]
                            else:  # not a plain integer: counted, left null
                                counters[_U(slot)] += 1
                                p = q
                        elif act == A_PIDTID:
                            err = E_TYPE_NUMSTR
                            break
                        elif act == A_IDLIKE or c == 110:
                            skip = True
                        elif act == A_ARGNUM:  # not a number: counted, left null
                            counters[_U(slot)] += 1
                            skip = True
                        else:
                            err = E_TYPE_NUM
                            break
                    elif act == A_BP:
                        if (c == 34 and p + 2 < n and buf[_U(p + 1)] == 101
                                and buf[_U(p + 2)] == 34):
                            ints[_U(I_BP), _U(ev)] = 1
                            ipres[_U(ev), _U(I_BP)] = 1
                        skip = True
                    elif act == A_ARGS:
                        if c == 123:
                            p = _ws(buf, p + 1, n)
                            if p >= n:
                                p = n
                                err = E_EOF
                                break
                            if buf[_U(p)] == 125:  # empty args
                                p += 1
                                errfield = FIELD_NONE
                                expect_end = True
                            else:
                                in_args = True
                            continue
                        if c == 110:
                            skip = True
                        else:
                            err = E_TYPE_OBJ
                            break
                    elif act == A_ARGSTR:
                        if c == 34:
                            str_col = slot
                        else:
                            skip = True
                    elif act == A_RAW:  # the value's JSON text as it is
                        q, err = _skip_value(buf, p, n)
                        if err != E_OK:
                            p = q
                            break
                        o = soffs[_U(slot), _U(ev)]
                        if o + (q - p) + 4 >= cap:
                            p = q
                            err = -1
                            break
                        for i in range(p, q):
                            sdata[_U(slot), _U(o)] = buf[_U(i)]
                            o += 1
                        soffs[_U(slot), _U(ev + 1)] = o
                        spres[_U(ev), _U(slot)] = 1
                        p = q
                    else:  # A_ARR3: grid, block
                        if c == 91:
                            p += 1
                            j = 0
                            while True:
                                p = _ws(buf, p, n)
                                if p >= n:
                                    p = n
                                    err = E_EOF
                                    break
                                c = buf[_U(p)]
                                if c == 93:
                                    p += 1
                                    break
                                if c == 44:
                                    p += 1
                                    continue
                                if not ((48 <= c <= 57) or c == 45):
                                    err = E_TYPE_NUM
                                    break
                                p, err, neg, ip, fr, fd, ex, hx = _parse_number(buf, p, n)
                                if err == E_OK:
                                    v, err = _to_int(neg, ip, fr, fd, ex, hx)
                                if err != E_OK:
                                    break
                                if j < 3:  # a 4th dimension is parsed (so checked), not kept
                                    ints[_U(slot + j), _U(ev)] = v
                                    ipres[_U(ev), _U(slot + j)] = 1
                                j += 1
                            if err != E_OK:
                                break
                        else:
                            # e.g. Triton cpu_op args carry "grid" as a string: not geometry
                            counters[_U(slot)] += 1
                            skip = True
                    if num_slot >= 0:
                        p, err, neg, ip, fr, fd, ex, hx = _parse_number(buf, p, n)
                        if err == E_OK:
                            if as_ns:
                                v, err = _to_ns(neg, ip, fr, fd, ex, hx)
                            else:
                                v, err = _to_int(neg, ip, fr, fd, ex, hx)
                        if err != E_OK:
                            break
                        ints[_U(num_slot), _U(ev)] = v
                        ipres[_U(ev), _U(num_slot)] = 1
                    elif str_col >= 0:
                        o0 = soffs[_U(str_col), _U(ev)]
                        p, o, err = _copy_string(buf, p, n, sdata, str_col, o0, cap)
                        if err != E_OK:
                            break
                        soffs[_U(str_col), _U(ev + 1)] = o
                        spres[_U(ev), _U(str_col)] = 1
                    elif skip:
                        p, err = _skip_value(buf, p, n)
                        if err != E_OK:
                            break
                    if not in_args or k >= 0:
                        errfield = FIELD_NONE
                    expect_end = True
            if err == -1:
                # string buffers full: hand back this batch and redo the event in the next
                p = p0
                res[_U(R_FULL)] = 2
                if nev == 0:
                    res[_U(R_ERR)] = E_BIGEVENT
                break
            if err != E_OK:
                res[_U(R_ERR)] = err
                break
            nev += 1
        else:
            p = _ws(buf, p, n)
            if p < n:
                res[_U(R_ERR)] = E_TRAILING
            elif partial:
                res[_U(R_ERR)] = E_MORE  # trailing data can only be ruled out at the very end
            break
    if partial and (res[_U(R_ERR)] == E_EOF or res[_U(R_ERR)] == E_EMPTY):
        p = p_safe
        state = state_safe
        res[_U(R_ERR)] = E_MORE
        errfield = FIELD_NONE
    res[_U(R_POS)] = p
    res[_U(R_STATE)] = state
    res[_U(R_N)] = nev
    res[_U(R_ERRPOS)] = p
    res[_U(R_ERRFIELD)] = errfield
    return nev
