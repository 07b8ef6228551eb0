"""Compiled scanner for Chrome-trace / Kineto JSON: bytes in, columns out.

Why not ``json.load``: a 1 GB trace becomes tens of millions of Python objects (several GB) and
takes minutes. This scanner walks the bytes once with a small state machine compiled by numba and
writes only the fields the activity tables need into preallocated column arrays, one batch of
events at a time, so memory grows with the tables and not with the JSON. Nesting is tracked with a
counter (no recursion), so a hostile file cannot overflow the stack.

Layout of one batch (``B`` events):
  ints[NI, B]  int64 values, ipres[NI, B] 1 where present
  sdata[NS, CAP] bytes of decoded strings per string column, soffs[NS, B + 1] Arrow-style offsets,
  spres[B, NS] 1 where present
Times are converted from microseconds to integer nanoseconds exactly from the decimal digits
(no float rounding) unless the number has an exponent.
"""

from __future__ import annotations

import numba
import numpy as np

# ---- int columns -------------------------------------------------------------------------------
I_PH, I_PID, I_TID, I_TS, I_DUR, I_ID, I_BP = range(7)
(I_EXT, I_CORR, I_DEV, I_CTX, I_STREAM, I_BYTES, I_CBID, I_REGS, I_SHMEM, I_SEQ, I_FWDTID,
 I_PYID, I_PYPAR, I_WSTREAM, I_WEVCORR, I_WEVID, I_INEL, I_OUTEL, I_GROUP) = range(7, 26)
I_GRID = 26   # 26, 27, 28
I_BLOCK = 29  # 29, 30, 31
NI = 32

# ---- string columns ----------------------------------------------------------------------------
(S_CAT, S_NAME, S_PID, S_TID, S_COLL, S_DTYPE, S_PG, S_SYNCKIND, S_KIND, S_ARGNAME, S_INDIMS,
 S_INTYPE) = range(12)
NS = 12

# ---- keys --------------------------------------------------------------------------------------
# top-level event keys -> field id
K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ID, K_BP, K_ARGS = range(10)
TOP_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "args"]

# args keys: (key, kind, slot). kind 0 numeric -> ints slot, 1 string -> string column,
# 2 raw JSON text -> string column, 3 array of up to 3 ints -> ints slots slot..slot+2
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
]
ARG_FIELD_BASE = 100  # field ids of args keys in error reports: ARG_FIELD_BASE + index


def _key_table(keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    enc = [k.encode() for k in keys]
    offs = np.zeros(len(enc) + 1, np.int64)
    offs[1:] = np.cumsum([len(k) for k in enc])
    return np.frombuffer(b"".join(enc), np.uint8).copy(), offs


TOP_TAB, TOP_OFFS = _key_table(TOP_KEYS)
ARG_TAB, ARG_OFFS = _key_table([k for k, _, _ in ARG_KEYS])
ARG_KIND = np.array([k for _, k, _ in ARG_KEYS], np.int64)
ARG_SLOT = np.array([s for _, _, s in ARG_KEYS], np.int64)

# ---- results and errors ------------------------------------------------------------------------
R_POS, R_STATE, R_N, R_ERR, R_ERRPOS, R_ERRFIELD, R_NMETA, R_TOPOBJ, R_SAWEV = range(9)
NR = 9
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
_NEXT = 99         # inside the object parsers only: another member follows (never returned)

MAX_DEPTH = 512
_TRACE_EVENTS = tuple(b"traceEvents")
FIELD_NONE = -1
FIELD_EVENT = -2   # the event itself

# counters (cumulative across batches): strings that were not numbers, per int slot
C_NONNUM = 0  # C_NONNUM + slot
NC = NI


@numba.njit(cache=True, nogil=True, inline="always")
def _ws(buf, p, n):
    while p < n:
        c = buf[p]
        if c == 32 or c == 10 or c == 13 or c == 9:
            p += 1
        else:
            break
    return p


@numba.njit(cache=True, nogil=True, inline="always")
def _skip_string(buf, p, n):
    # p at opening quote; returns index after closing quote, or -1 at end of input
    p += 1
    while p < n:
        c = buf[p]
        if c == 92:
            p += 2
        elif c == 34:
            return p + 1
        else:
            p += 1
    return -1


@numba.njit(cache=True, nogil=True)
def _skip_value(buf, p, n):
    """Skip one JSON value starting at p. Returns (new p, error)."""
    if p >= n:
        return p, E_EOF
    c = buf[p]
    if c == 34:
        q = _skip_string(buf, p, n)
        if q < 0:
            return n, E_EOF
        return q, E_OK
    if c == 123 or c == 91:
        depth = 0
        while p < n:
            c = buf[p]
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
        c = buf[p]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            return p, E_OK
        p += 1
    return n, E_EOF


@numba.njit(cache=True, nogil=True, inline="always")
def _parse_number(buf, p, n):
    """Parse a JSON number. Returns (p, err, neg, ip, frac, fdigits, exp, has_exp)."""
    neg = False
    if p < n and buf[p] == 45:
        neg = True
        p += 1
    ip = 0
    nd = 0
    while p < n and 48 <= buf[p] <= 57:
        if nd >= 18:
            return p, E_RANGE, neg, 0, 0, 0, 0, False
        ip = ip * 10 + (buf[p] - 48)
        nd += 1
        p += 1
    if nd == 0:
        return p, E_SYNTAX, neg, 0, 0, 0, 0, False
    frac = 0
    fd = 0
    if p < n and buf[p] == 46:
        p += 1
        while p < n and 48 <= buf[p] <= 57:
            if fd < 9:
                frac = frac * 10 + (buf[p] - 48)
                fd += 1
            p += 1
    exp = 0
    has_exp = False
    if p < n and (buf[p] == 101 or buf[p] == 69):
        has_exp = True
        p += 1
        eneg = False
        if p < n and (buf[p] == 45 or buf[p] == 43):
            eneg = buf[p] == 45
            p += 1
        ed = 0
        while p < n and 48 <= buf[p] <= 57:
            if ed < 4:
                exp = exp * 10 + (buf[p] - 48)
            ed += 1
            p += 1
        if ed == 0:
            return p, E_SYNTAX, neg, 0, 0, 0, 0, False
        if eneg:
            exp = -exp
    if p >= n:
        return p, E_EOF, neg, 0, 0, 0, 0, False
    return p, E_OK, neg, ip, frac, fd, exp, has_exp


@numba.njit(cache=True, nogil=True, inline="always")
def _pow10(k):
    r = 1
    for _ in range(k):
        r *= 10
    return r


@numba.njit(cache=True, nogil=True, inline="always")
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


@numba.njit(cache=True, nogil=True, inline="always")
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


@numba.njit(cache=True, nogil=True, inline="always")
def _put_number(buf, p, n, ints, ipres, slot, ev, as_ns):
    """Parse the JSON number at p into ints[slot, ev] (microseconds -> ns when as_ns).
    Returns (p, err)."""
    p, err, neg, ip, fr, fd, ex, hx = _parse_number(buf, p, n)
    if err != E_OK:
        return p, err
    if as_ns:
        v, err = _to_ns(neg, ip, fr, fd, ex, hx)
    else:
        v, err = _to_int(neg, ip, fr, fd, ex, hx)
    if err != E_OK:
        return p, err
    ints[slot, ev] = v
    ipres[slot, ev] = 1
    return p, E_OK


@numba.njit(cache=True, nogil=True, inline="always")
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
    if buf[s] == 45:
        neg = True
        s += 1
        if s >= e:
            return q, False, 0
    v = 0
    for i in range(s, e):
        c = buf[i]
        if c < 48 or c > 57:
            return q, False, 0
        v = v * 10 + (c - 48)
    if neg:
        v = -v
    return q, True, v


@numba.njit(cache=True, nogil=True, inline="always")
def _put_int_like(buf, p, n, c, ints, ipres, counters, slot, ev):
    """An integer field given as a number or as a string of digits (old Kineto writes ids
    both ways), at p with first byte c: stored in ``ints[slot]``; a string that is not a
    plain integer is counted in ``counters[slot]`` and skipped. Returns (p, err), err _NEXT
    when the value is neither a number nor a string (the caller decides)."""
    if (48 <= c <= 57) or c == 45:
        return _put_number(buf, p, n, ints, ipres, slot, ev, False)
    if c != 34:
        return p, _NEXT
    q, ok, v = _digits_in_string(buf, p, n)
    if q < 0:
        return n, E_EOF
    if ok:
        ints[slot, ev] = v
        ipres[slot, ev] = 1
    else:
        counters[slot] += 1
    return q, E_OK


@numba.njit(cache=True, nogil=True, inline="always")
def _put_utf8(out, o, cp):
    if cp < 0x80:
        out[o] = cp
        return o + 1
    if cp < 0x800:
        out[o] = 0xC0 | (cp >> 6)
        out[o + 1] = 0x80 | (cp & 0x3F)
        return o + 2
    if cp < 0x10000:
        out[o] = 0xE0 | (cp >> 12)
        out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[o + 2] = 0x80 | (cp & 0x3F)
        return o + 3
    out[o] = 0xF0 | (cp >> 18)
    out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[o + 3] = 0x80 | (cp & 0x3F)
    return o + 4


@numba.njit(cache=True, nogil=True, inline="always")
def _hex4(buf, p, n):
    if p + 4 > n:
        return -1
    v = 0
    for i in range(4):
        c = buf[p + i]
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


@numba.njit(cache=True, nogil=True, inline="always")
def _copy_string(buf, p, n, out, o, cap):
    """Decode the JSON string at p (opening quote) into out[o:]. Returns (p, o, err);
    err -1 means the output buffer is full."""
    p += 1
    while p < n:
        c = buf[p]
        if o + 4 >= cap:
            return p, o, -1
        if c == 34:
            return p + 1, o, E_OK
        if c != 92:
            out[o] = c
            o += 1
            p += 1
            continue
        if p + 1 >= n:
            return n, o, E_EOF
        e = buf[p + 1]
        p += 2
        if e == 110:
            out[o] = 10
        elif e == 116:
            out[o] = 9
        elif e == 114:
            out[o] = 13
        elif e == 98:
            out[o] = 8
        elif e == 102:
            out[o] = 12
        elif e == 34 or e == 92 or e == 47:
            out[o] = e
        elif e == 117:
            cp = _hex4(buf, p, n)
            if cp == -1:
                return n, o, E_EOF
            if cp < 0:
                return p, o, E_BADSTR
            p += 4
            if 0xD800 <= cp < 0xDC00 and p + 6 <= n and buf[p] == 92 and buf[p + 1] == 117:
                lo = _hex4(buf, p + 2, n)
                if 0xDC00 <= lo < 0xE000:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    p += 6
            if 0xD800 <= cp < 0xE000:
                cp = 0xFFFD  # lone surrogate: replacement character
            o = _put_utf8(out, o, cp)
            continue
        else:
            return p, o, E_BADSTR
        o += 1
    return n, o, E_EOF


@numba.njit(cache=True, nogil=True, inline="always")
def _match(buf, ks, klen, tab, offs):
    nk = offs.shape[0] - 1
    for k in range(nk):
        a = offs[k]
        if offs[k + 1] - a != klen:
            continue
        same = True
        for i in range(klen):
            if buf[ks + i] != tab[a + i]:
                same = False
                break
        if same:
            return k
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _put_str(buf, p, n, col, ev, sdata, soffs, spres, cap):
    """Copy the string value at p into string column col for event ev."""
    o0 = soffs[col, ev]
    p2, o, err = _copy_string(buf, p, n, sdata[col], o0, cap)
    if err != E_OK:
        return p2, err
    soffs[col, ev + 1] = o
    spres[ev, col] = 1
    return p2, E_OK


@numba.njit(cache=True, nogil=True)
def _put_raw(buf, p, n, col, ev, sdata, soffs, spres, cap):
    """Copy the raw JSON text of the value at p into string column col."""
    q, err = _skip_value(buf, p, n)
    if err != E_OK:
        return q, err
    o = soffs[col, ev]
    if o + (q - p) + 4 >= cap:
        return q, -1
    out = sdata[col]
    for i in range(p, q):
        out[o] = buf[i]
        o += 1
    soffs[col, ev + 1] = o
    spres[ev, col] = 1
    return q, E_OK


@numba.njit(cache=True, nogil=True, inline="always")
def _open_object(buf, p, n):
    """p at '{'. Returns (p past '{' and any space, _NEXT) when members follow, (p past '}',
    E_OK) for an empty object, else an error."""
    p = _ws(buf, p + 1, n)
    if p >= n:
        return n, E_EOF
    if buf[p] == 125:
        return p + 1, E_OK
    return p, _NEXT


@numba.njit(cache=True, nogil=True, inline="always")
def _member_key(buf, p, n):
    """p before a member's '"key":'. Returns (p at its value, key start, key length, err)."""
    p = _ws(buf, p, n)
    if p >= n:
        return n, 0, 0, E_EOF
    if buf[p] != 34:
        return p, 0, 0, E_SYNTAX
    ks = p + 1
    q = _skip_string(buf, p, n)
    if q < 0:
        return n, 0, 0, E_EOF
    p = _ws(buf, q, n)
    if p >= n:
        return n, 0, 0, E_EOF
    if buf[p] != 58:
        return p, 0, 0, E_SYNTAX
    p = _ws(buf, p + 1, n)
    if p >= n:
        return n, 0, 0, E_EOF
    return p, ks, q - 1 - ks, E_OK


@numba.njit(cache=True, nogil=True, inline="always")
def _member_end(buf, p, n):
    """p after a member's value. Returns (p past ',', _NEXT) when another member follows,
    (p past '}', E_OK) at the object's end, else an error."""
    p = _ws(buf, p, n)
    if p >= n:
        return n, E_EOF
    c = buf[p]
    if c == 44:
        return p + 1, _NEXT
    if c == 125:
        return p + 1, E_OK
    return p, E_SYNTAX


@numba.njit(cache=True, nogil=True)
def _parse_args(buf, p, n, ev, ints, ipres, sdata, soffs, spres, cap, counters, arg_tab,
                arg_offs, arg_kind, arg_slot, errfield):
    """p at '{' of args. Returns (p, err); errfield[0] set to the failing field id."""
    p, err = _open_object(buf, p, n)
    if err != _NEXT:
        return p, err
    while True:
        p, ks, klen, err = _member_key(buf, p, n)
        if err != E_OK:
            return p, err
        k = _match(buf, ks, klen, arg_tab, arg_offs)
        c = buf[p]
        if k < 0:
            p, err = _skip_value(buf, p, n)
            if err != E_OK:
                return p, err
        else:
            errfield[0] = 100 + k
            kind = arg_kind[k]
            slot = arg_slot[k]
            if kind == 0:
                p, err = _put_int_like(buf, p, n, c, ints, ipres, counters, slot, ev)
                if err == _NEXT:
                    if c != 110:
                        return p, E_TYPE_NUM
                    p, err = _skip_value(buf, p, n)  # null
                if err != E_OK:
                    return p, err
            elif kind == 1:
                if c == 34:
                    p, err = _put_str(buf, p, n, slot, ev, sdata, soffs, spres, cap)
                    if err != E_OK:
                        return p, err
                else:
                    p, err = _skip_value(buf, p, n)
                    if err != E_OK:
                        return p, err
            elif kind == 2:
                p, err = _put_raw(buf, p, n, slot, ev, sdata, soffs, spres, cap)
                if err != E_OK:
                    return p, err
            else:
                if c == 91:
                    p += 1
                    j = 0
                    while True:
                        p = _ws(buf, p, n)
                        if p >= n:
                            return n, E_EOF
                        c = buf[p]
                        if c == 93:
                            p += 1
                            break
                        if c == 44:
                            p += 1
                            continue
                        if (48 <= c <= 57) or c == 45:
                            if j < 3:
                                p, err = _put_number(buf, p, n, ints, ipres, slot + j, ev,
                                                     False)
                            else:  # a 4th dimension: parsed (so checked), not kept
                                p, err, neg, ip, fr, fd, ex, hx = _parse_number(buf, p, n)
                                if err == E_OK:
                                    v, err = _to_int(neg, ip, fr, fd, ex, hx)
                            if err != E_OK:
                                return p, err
                            j += 1
                        else:
                            return p, E_TYPE_NUM
                else:
                    # e.g. Triton cpu_op args carry "grid" as a string: not launch geometry
                    counters[slot] += 1
                    p, err = _skip_value(buf, p, n)
                    if err != E_OK:
                        return p, err
            errfield[0] = FIELD_NONE
        p, err = _member_end(buf, p, n)
        if err != _NEXT:
            return p, err


@numba.njit(cache=True, nogil=True)
def _parse_event(buf, p, n, ev, ints, ipres, sdata, soffs, spres, cap, counters,
                 top_tab, top_offs, arg_tab, arg_offs, arg_kind, arg_slot, errfield):
    """p at '{' of one event. Returns (p, err)."""
    p, err = _open_object(buf, p, n)
    if err != _NEXT:
        return p, err
    while True:
        p, ks, klen, err = _member_key(buf, p, n)
        if err != E_OK:
            return p, err
        k = _match(buf, ks, klen, top_tab, top_offs)
        c = buf[p]
        errfield[0] = k
        if k == K_PH:
            if c != 34:
                return p, E_TYPE_STR
            if p + 1 < n:
                ints[I_PH, ev] = buf[p + 1]
                ipres[I_PH, ev] = 1
            q = _skip_string(buf, p, n)
            if q < 0:
                return n, E_EOF
            p = q
        elif k == K_CAT or k == K_NAME:
            col = S_CAT if k == K_CAT else S_NAME
            if c == 34:
                p, err = _put_str(buf, p, n, col, ev, sdata, soffs, spres, cap)
                if err != E_OK:
                    return p, err
            elif c == 110:
                p, err = _skip_value(buf, p, n)
                if err != E_OK:
                    return p, err
            else:
                return p, E_TYPE_STR
        elif k == K_PID or k == K_TID:
            slot = I_PID if k == K_PID else I_TID
            col = S_PID if k == K_PID else S_TID
            if (48 <= c <= 57) or c == 45:
                p, err = _put_number(buf, p, n, ints, ipres, slot, ev, False)
                if err != E_OK:
                    return p, err
            elif c == 34:
                q, ok, v = _digits_in_string(buf, p, n)
                if q < 0:
                    return n, E_EOF
                if ok:
                    ints[slot, ev] = v
                    ipres[slot, ev] = 1
                    p = q
                else:
                    p, err = _put_str(buf, p, n, col, ev, sdata, soffs, spres, cap)
                    if err != E_OK:
                        return p, err
            else:
                return p, E_TYPE_NUMSTR
        elif k == K_TS or k == K_DUR:
            slot = I_TS if k == K_TS else I_DUR
            if (48 <= c <= 57) or c == 45:
                p, err = _put_number(buf, p, n, ints, ipres, slot, ev, True)
                if err != E_OK:
                    return p, err
            elif c == 110:
                p, err = _skip_value(buf, p, n)
                if err != E_OK:
                    return p, err
            else:
                return p, E_TYPE_NUM
        elif k == K_ID:
            p, err = _put_int_like(buf, p, n, c, ints, ipres, counters, I_ID, ev)
            if err == _NEXT:
                p, err = _skip_value(buf, p, n)
            if err != E_OK:
                return p, err
        elif k == K_BP:
            if c == 34 and p + 2 < n and buf[p + 1] == 101 and buf[p + 2] == 34:
                ints[I_BP, ev] = 1
                ipres[I_BP, ev] = 1
            p, err = _skip_value(buf, p, n)
            if err != E_OK:
                return p, err
        elif k == K_ARGS:
            if c == 123:
                p, err = _parse_args(buf, p, n, ev, ints, ipres, sdata, soffs, spres, cap,
                                     counters, arg_tab, arg_offs, arg_kind, arg_slot, errfield)
                if err != E_OK:
                    return p, err
            elif c == 110:
                p, err = _skip_value(buf, p, n)
                if err != E_OK:
                    return p, err
            else:
                return p, E_TYPE_OBJ
        else:
            p, err = _skip_value(buf, p, n)
            if err != E_OK:
                return p, err
        errfield[0] = FIELD_NONE
        p, err = _member_end(buf, p, n)
        if err != _NEXT:
            return p, err


@numba.njit(cache=True, nogil=True)
def scan(buf, res, ints, ipres, sdata, soffs, spres, counters, meta,
         top_tab, top_offs, arg_tab, arg_offs, arg_kind, arg_slot, partial):
    """Scan from res[R_POS] in state res[R_STATE] until the batch is full or the document ends.

    With ``partial`` set, ``buf`` is the part of the document inflated so far: running out of
    input returns E_MORE with the position rolled back to the start of the unfinished event (or
    top-level key), to be called again once there is more. Runs without the GIL, so inflating
    the rest of the file goes on in another thread meanwhile.

    On return res holds the new position and state, the number of events in this batch, and an
    error code with its byte position and field id. meta[i] = (key start, key end, value start,
    value end) of the top-level keys other than traceEvents (res[R_NMETA] of them)."""
    n = buf.shape[0]
    bmax = ints.shape[1]
    cap = sdata.shape[1]
    p = res[R_POS]
    state = res[R_STATE]
    nev = 0
    errfield = np.full(1, FIELD_NONE, np.int64)
    for c in range(NS):
        soffs[c, 0] = 0
    ipres[:, :] = 0
    res[R_ERR] = E_OK
    while True:
        p_safe = p
        state_safe = state
        if state == ST_START:
            p = _ws(buf, p, n)
            if p >= n:
                res[R_ERR] = E_EMPTY
                break
            c = buf[p]
            if c == 123:
                res[R_TOPOBJ] = 1
                state = ST_TOPKEY
                p += 1
            elif c == 91:
                res[R_TOPOBJ] = 0
                state = ST_EVENTS
                p += 1
            else:
                res[R_ERR] = E_NOTTRACE
                break
        elif state == ST_TOPKEY:
            p = _ws(buf, p, n)
            if p >= n:
                res[R_ERR] = E_EOF
                break
            c = buf[p]
            if c == 125:
                p += 1
                state = ST_DONE
                continue
            if c == 44:
                p += 1
                continue
            if c != 34:
                res[R_ERR] = E_SYNTAX
                break
            ks = p + 1
            q = _skip_string(buf, p, n)
            if q < 0:
                res[R_ERR] = E_EOF
                p = n
                break
            ke = q - 1
            p = _ws(buf, q, n)
            if p >= n or buf[p] != 58:
                res[R_ERR] = E_EOF if p >= n else E_SYNTAX
                break
            p = _ws(buf, p + 1, n)
            is_events = ke - ks == 11
            if is_events:
                for i in range(11):
                    if buf[ks + i] != _TRACE_EVENTS[i]:
                        is_events = False
                        break
            if is_events and p < n and buf[p] == 91:
                res[R_SAWEV] = 1
                p += 1
                state = ST_EVENTS
                continue
            vs = p
            p, err = _skip_value(buf, p, n)
            if err != E_OK:
                res[R_ERR] = err
                break
            m = res[R_NMETA]
            if m < meta.shape[0]:
                meta[m, 0] = ks
                meta[m, 1] = ke
                meta[m, 2] = vs
                meta[m, 3] = p
                res[R_NMETA] = m + 1
        elif state == ST_EVENTS:
            p = _ws(buf, p, n)
            if p >= n:
                res[R_ERR] = E_EOF
                break
            c = buf[p]
            if c == 93:
                p += 1
                state = ST_TOPKEY if res[R_TOPOBJ] == 1 else ST_DONE
                continue
            if c == 44:
                p += 1
                continue
            if c != 123:
                errfield[0] = FIELD_EVENT
                res[R_ERR] = E_TYPE_OBJ
                break
            if nev >= bmax:
                break
            for j in range(NS):
                spres[nev, j] = 0
                soffs[j, nev + 1] = soffs[j, nev]
            p0 = p
            p, err = _parse_event(buf, p, n, nev, ints, ipres, sdata, soffs, spres, cap,
                                  counters, top_tab, top_offs, arg_tab, arg_offs, arg_kind,
                                  arg_slot, errfield)
            if err == -1:
                # string buffers full: hand back this batch and redo the event in the next
                p = p0
                if nev == 0:
                    res[R_ERR] = E_BIGEVENT
                break
            if err != E_OK:
                res[R_ERR] = err
                break
            nev += 1
        else:
            p = _ws(buf, p, n)
            if p < n:
                res[R_ERR] = E_TRAILING
            elif partial:
                res[R_ERR] = E_MORE  # trailing data can only be ruled out at the very end
            break
    if partial and (res[R_ERR] == E_EOF or res[R_ERR] == E_EMPTY):
        p = p_safe
        state = state_safe
        res[R_ERR] = E_MORE
        errfield[0] = FIELD_NONE
    res[R_POS] = p
    res[R_STATE] = state
    res[R_N] = nev
    res[R_ERRPOS] = p
    res[R_ERRFIELD] = errfield[0]
    return nev
