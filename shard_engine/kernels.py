"""Compiled loops: the engine's few hot paths that numpy cannot vectorise (ADR 0162).

A claim (``shard_engine.claims``) walks one cluster's needs in order, each
taking machines from what the previous ones left: a few hundred small,
sequential steps over ~15 needs and ~15 held profiles. Written with numpy,
each step was a handful of calls on arrays of a dozen elements, and the
calls' overhead was most of the cost: some 230 µs a claim, 63 % of the
500K-machine steady cycle. Counting a cluster's bound machines
(``Worksheet.bound``) made half a dozen temporaries of a few thousand rows
for one histogram; it now reads counts kept per pool (``PoolCodes``,
ADR 0163) in one pass. Here both are plain loops compiled by numba.

**Same arithmetic, same decisions.** Each function performs the floating
point operations of the numpy code it replaced, in the same order (running
sums left to right, as :func:`shard_engine.linear.combine` adds; ``max`` and
``min`` with numpy's and Python's tie rules), so its results are bit for bit
what they were; ``tests/unit/engine/test_kernels.py`` keeps the numpy code
as an oracle and compares exactly on random inputs. The one deliberate
difference is the take (:func:`_take`), ADR 0162.

**Loading.** The module is imported by the functions that use it, not at
the top of theirs, so commands that never run a cycle do not load numba.
Compiled code is cached on disk next to this file (or in
``NUMBA_CACHE_DIR``): the first process on a machine compiles for ~7 s, the
next load in ~0.2 s. :func:`warm` compiles or loads everything up front;
the shard process and ``make install`` call it, so no cycle pays for it.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

__all__ = [
    "NOTHING",
    "NO_PLACED",
    "NO_PRIORITY",
    "UNBOUNDED",
    "bound_tally",
    "claim_all",
    "columns_of",
    "cover",
    "cover_units",
    "divide",
    "excess",
    "excess_one",
    "gather",
    "have_rows",
    "member_codes",
    "refresh_codes",
    "spread_fill",
    "usable",
    "warm",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

NO_PLACED = np.zeros((0, 0))
"""``divide``'s ``placed`` when nothing is bound."""
NO_PRIORITY = np.zeros(0, dtype=np.int64)
"""``divide``'s ``priority`` when the needs are not ranked."""
UNBOUNDED = 2**62
"""``excess`` for a profile no need bounds."""
NOTHING = np.zeros(0, dtype=np.int64)
"""``bound_tally``'s ``minus``, ``plus`` or ``skip`` when there are no such rows."""


@njit(cache=True)
def gather(
    matrix: BoolArray, supply: IntArray, alloc: FloatArray, width: int
) -> tuple[IntArray, BoolArray, FloatArray, FloatArray, bool]:
    """A claim's inputs over the profiles the cluster holds (``supply[:width]`` not zero).

    Returns the held profiles, the needs' matrix and the shapes over them,
    the machines held of each (as floats), and whether some held profile
    may serve more than one need.
    """
    count = 0
    for p in range(width):
        if supply[p] != 0:
            count += 1
    held = np.empty(count, dtype=np.int64)
    k = 0
    for p in range(width):
        if supply[p] != 0:
            held[k] = p
            k += 1
    needs = matrix.shape[0]
    sub = np.empty((needs, count), dtype=np.bool_)
    shapes = np.empty((count, alloc.shape[1]))
    counts = np.empty(count)
    several = False
    for k in range(count):
        p = held[k]
        users = 0
        for i in range(needs):
            sub[i, k] = matrix[i, p]
            if matrix[i, p]:
                users += 1
        if users > 1:
            several = True
        for d in range(alloc.shape[1]):
            shapes[k, d] = alloc[p, d]
        counts[k] = supply[p]
    return held, sub, shapes, counts, several


@njit(cache=True)
def claim_all(
    matrix: BoolArray,
    supply: IntArray,
    alloc: FloatArray,
    width: int,
    aggregate: FloatArray,
    present: IntArray,
    bound: FloatArray,
    has_bound: bool,
    priority: IntArray,
    ranked: bool,
) -> tuple[bool, IntArray, BoolArray, FloatArray, FloatArray, FloatArray]:
    """A whole claim in one call: :func:`gather`, the bound columns, then :func:`divide`.

    ``present`` and ``bound`` are the cluster's bound machines per (need,
    profile) as ``Worksheet.counted`` keeps them (one column per profile of
    ``present``), read before the held profiles are known. Returns whether
    some held machine is shared (when not, the claim is None and the rest is
    empty), then the held profiles, the matrix and shapes over them, ``own``
    and what moved. Each step is the separate kernel's own code, so the
    result is theirs bit for bit; one call instead of three saves a claim
    the boxing of a dozen arrays between them.
    """
    held, sub, shapes, counts, several = gather(matrix, supply, alloc, width)
    if len(held) == 0 or not several:
        return False, held, sub, shapes, np.zeros((0, 0)), np.zeros((0, 4))
    placed = np.zeros((0, 0))
    has_placed = False
    if has_bound:
        placed = columns_of(present, bound, held)
        for v in placed.ravel():
            if v != 0.0:
                has_placed = True
                break
    own, moves = divide(sub, counts, shapes, aggregate, placed, has_placed, held, priority, ranked)
    return True, held, sub, shapes, own, moves


@njit(cache=True)
def _floor0(x: float) -> float:
    """``np.maximum(x, 0.0)``."""
    return x if x >= 0.0 else 0.0


@njit(cache=True)
def _any(row: FloatArray) -> bool:
    """``row.any()``: some entry is not zero."""
    for v in row:  # noqa: SIM110 (a loop compiles; a generator in any() does not pay)
        if v != 0.0:
            return True
    return False


@njit(cache=True)
def _less_wanted(wanted: FloatArray, taken: FloatArray, shapes: FloatArray) -> None:
    """``wanted = np.maximum(wanted - combine(taken, shapes), 0.0)``, in place.

    The products are added left to right in profile order, as
    :func:`~shard_engine.linear.combine` adds them.
    """
    for d in range(len(wanted)):
        total = taken[0] * shapes[0, d]
        for p in range(1, len(taken)):
            total = total + taken[p] * shapes[p, d]
        wanted[d] = _floor0(wanted[d] - total)


@njit(cache=True)
def divide(
    sub: BoolArray,
    counts: FloatArray,
    shapes: FloatArray,
    aggregate: FloatArray,
    placed: FloatArray,
    has_placed: bool,
    held: IntArray,
    priority: IntArray,
    ranked: bool,
) -> tuple[FloatArray, FloatArray]:
    """The three passes (module docstring): ``own`` per need and held profile, and what moved.

    Returns ``own``, then one row (from need, to need, profile, machines)
    per profile whose machines a higher-priority need took over: what it
    took over, plus the lower need's unclaimed bound machines it had taken
    as anyone's (rebinding both makes the takeover happen once).
    """
    n, h = sub.shape
    dims = shapes.shape[1]
    # How many later needs (in cycle order) could use each held profile: a need
    # takes the profiles fewest later needs can use first, so a broad need does
    # not take what a narrower one after it depends on.
    later = np.zeros((n, h), dtype=np.int64)
    for p in range(h):
        users = 0
        for i in range(n - 1, -1, -1):
            later[i, p] = users
            if sub[i, p]:
                users += 1
    left = counts.copy()
    claims = np.zeros((n, h))
    wanted = np.empty((n, dims))
    # Scratch for ``_take``: what one take gives, its profiles in order, what stays short.
    taken_row = np.empty(h)
    order = np.empty(h, dtype=np.int64)
    rest = np.empty(dims)
    for i in range(n):
        for d in range(dims):
            wanted[i, d] = _floor0(aggregate[i, d])
    # The machines placed for each need, within what it may use.
    mine = np.zeros((n, h))
    bound = False
    if has_placed:  # one column per held profile
        for i in range(min(placed.shape[0], n)):
            for p in range(min(h, placed.shape[1])):
                if sub[i, p]:
                    mine[i, p] = placed[i, p]
                    if mine[i, p] != 0.0:
                        bound = True
    if bound:
        # First every need takes back the machines placed for it, as far as it
        # still wants them; what it no longer wants is anyone's.
        fits = True
        for p in range(h):
            total = mine[0, p]
            for i in range(1, n):
                total += mine[i, p]
            if not total <= counts[p]:
                fits = False
        partial = np.zeros(n, dtype=np.bool_)
        for i in range(n):
            positive = 0
            at = -1
            for p in range(h):
                if mine[i, p] > 0.0:
                    positive += 1
                    if at < 0:
                        at = p
            if fits and positive == 1:
                # The usual case: bound to machines of one shape, a need takes
                # as many of them as cover what it asks for, independently of
                # the others (no profile is bound beyond what is held).
                per = 0.0
                for d in range(dims):
                    ask = wanted[i, d]
                    if ask > 0.0 and shapes[at, d] > 0.0:
                        ratio = ask / shapes[at, d]
                        if ratio > per:
                            per = ratio
                taken = mine[i, at] if mine[i, at] <= per else per
                claims[i, at] = taken
                left[at] -= taken
                for d in range(dims):
                    wanted[i, d] = _floor0(wanted[i, d] - taken * shapes[at, d])
            elif _any(mine[i]):
                partial[i] = True
        available = np.empty(h)
        for i in range(n):
            if not partial[i]:
                continue
            for p in range(h):
                available[p] = mine[i, p] if mine[i, p] <= left[p] else left[p]
            _take(wanted[i], available, later[i], shapes, taken_row, order, rest)
            for p in range(h):
                claims[i, p] += taken_row[p]
                left[p] -= taken_row[p]
            _less_wanted(wanted[i], taken_row, shapes)
    # Then the needs still wanting, from what nobody holds; what is left only
    # shrinks, so a need with nothing left in its mask now gets nothing later.
    still = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        if _any(wanted[i]):
            for p in range(h):
                if sub[i, p] and left[p] > 0.0:
                    still[i] = True
                    break
    offered = np.empty(h)
    second = np.zeros((n, h))  # what each need took here, for the takeovers below
    for i in range(n):
        if not still[i]:
            continue
        for p in range(h):
            offered[p] = left[p] if sub[i, p] else 0.0
        if not _any(offered):
            continue
        _take(wanted[i], offered, later[i], shapes, taken_row, order, rest)
        for p in range(h):
            claims[i, p] += taken_row[p]
            second[i, p] += taken_row[p]
            left[p] -= taken_row[p]
        _less_wanted(wanted[i], taken_row, shapes)
    moves = np.empty((16, 4))  # from need, to need, profile, machines
    moved = 0
    if ranked:
        # Per need and profile, the bound machines it does not claim (below).
        unclaimed = np.zeros((n, h))
        if bound:
            for j in range(n):
                for p in range(h):
                    if mine[j, p] > claims[j, p]:
                        unclaimed[j, p] = mine[j, p] - claims[j, p]
        short = np.zeros(n, dtype=np.bool_)
        for i in range(n):
            short[i] = _any(wanted[i])
        for i in range(n):
            if not short[i]:
                continue
            for j in range(n - 1, i, -1):  # the lowest priority first
                if not _any(wanted[i]):
                    break
                if priority[j] >= priority[i]:
                    break
                for p in range(h):
                    offered[p] = claims[j, p] if sub[i, p] else 0.0
                if not _any(offered):
                    continue
                _take(wanted[i], offered, later[i], shapes, taken_row, order, rest)
                took = False
                for p in range(h):
                    if not taken_row[p] > 0.0:
                        continue
                    took = True
                    # ``j`` claims its bound machines up to what it wants, so rebinding
                    # only what was taken over would leave its claim where it is while
                    # it holds bound machines it does not claim, and the takeover would
                    # come back next cycle. Those spare machines went to the second
                    # pass; what ``i`` took of them there moves with the take, and the
                    # takeover happens once (ADR 0152).
                    given = unclaimed[j, p] if unclaimed[j, p] < second[i, p] else second[i, p]
                    unclaimed[j, p] -= given
                    second[i, p] -= given
                    move = taken_row[p] + given
                    if moved == len(moves):
                        grown = np.empty((2 * len(moves), 4))
                        grown[:moved] = moves
                        moves = grown
                    moves[moved, 0] = j
                    moves[moved, 1] = i
                    moves[moved, 2] = held[p]
                    moves[moved, 3] = move
                    moved += 1
                if not took:
                    continue
                for p in range(h):
                    claims[j, p] -= taken_row[p]
                    claims[i, p] += taken_row[p]
                _less_wanted(wanted[i], taken_row, shapes)
    own = np.empty((n, h))
    for p in range(h):
        total = claims[0, p]
        for i in range(1, n):
            total += claims[i, p]
        spare = counts[p] - total
        for i in range(n):
            own[i, p] = spare + claims[i, p]
    return own, moves[:moved].copy()


@njit(cache=True)
def _take(
    wanted: FloatArray,
    available: FloatArray,
    contest: IntArray,
    shapes: FloatArray,
    taken: FloatArray,
    order: IntArray,
    rest: FloatArray,
) -> None:
    """Machines per profile that cover ``wanted``, least contested profiles first, into ``taken``.

    Each profile in turn gives as many machines as the resources still short
    that it has call for, at most what is available: whole profiles while
    something stays short, the last one in part (a fraction of a machine:
    claims are shares, not placements). A profile with none of the resources
    still short gives nothing. Ties in contest go to the lower profile.

    One walk for any number of profiles: the numpy version switched to
    running sums past a dozen candidates, which took whole every profile
    ahead of which any resource was short, including profiles without that
    resource (a need claimed GPU servers for the CPU it still lacked).

    ``order`` (one slot per profile) and ``rest`` (one per resource) are the
    caller's scratch: a claim takes up to three times per need, and
    allocating them each time was a third of its cost.
    """
    h = len(available)
    dims = len(wanted)
    for p in range(h):
        taken[p] = 0.0
    if not _any_positive(wanted):
        return
    # The profiles with some machine available, ascending, then by contest.
    count = 0
    for p in range(h):
        if available[p] > 0.0:
            order[count] = p
            count += 1
    if count == 0:
        return
    _by_contest(order[:count], contest)
    for d in range(dims):
        rest[d] = wanted[d]
    for k in range(count):
        p = order[k]
        machines = 0.0
        for d in range(dims):
            if rest[d] > 0.0 and shapes[p, d] > 0.0:
                ratio = rest[d] / shapes[p, d]
                if ratio > machines:
                    machines = ratio
        if machines <= 0.0:
            continue
        count_p = machines if machines < available[p] else available[p]
        taken[p] = count_p
        done = True
        for d in range(dims):
            if rest[d] > 0.0:
                less = rest[d] - count_p * shapes[p, d]
                rest[d] = less if less > 0.0 else 0.0
                done = done and rest[d] <= 0.0
        if done:
            break


@njit(cache=True)
def _any_positive(row: FloatArray) -> bool:
    """``(row > 0.0).any()``."""
    for v in row:  # noqa: SIM110 (a loop compiles; a generator in any() does not pay)
        if v > 0.0:
            return True
    return False


@njit(cache=True)
def _by_contest(order: IntArray, contest: IntArray) -> None:
    """``order`` (ascending profiles) sorted in place by contest, ties to the lower profile."""
    for k in range(1, len(order)):
        p = order[k]
        j = k - 1
        while j >= 0 and contest[order[j]] > contest[p]:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = p


@njit(cache=True)
def member_codes(
    members: npt.NDArray[np.int32], codes: npt.NDArray[np.int32]
) -> tuple[IntArray, IntArray]:
    """The binding codes among ``members`` (sorted) and how many rows hold each.

    ``codes`` is the code per row (``Bindings.codes``); rows past its end and
    rows bound to nothing are left out. A bound pool's few hundred rows are
    mostly of one code, so each row is matched against the few codes seen
    so far, the last one first.
    """
    distinct = np.empty(8, dtype=np.int64)
    counts = np.zeros(8, dtype=np.int64)
    seen = 0
    last = 0
    for k in range(len(members)):
        row = members[k]
        if row >= len(codes) or codes[row] < 0:
            continue
        code = codes[row]
        if seen and distinct[last] == code:
            counts[last] += 1
            continue
        last = -1
        for j in range(seen):
            if distinct[j] == code:
                last = j
                break
        if last < 0:
            if seen == len(distinct):
                distinct = np.concatenate((distinct, np.empty(seen, dtype=np.int64)))
                counts = np.concatenate((counts, np.zeros(seen, dtype=np.int64)))
            last = seen
            distinct[seen] = code
            seen += 1
        counts[last] += 1
    order = np.argsort(distinct[:seen], kind="mergesort")
    return distinct[:seen][order], counts[:seen][order]


@njit(cache=True)
def refresh_codes(
    mine: IntArray,
    generation: IntArray,
    arena: npt.NDArray[np.int32],
    begin: IntArray,
    counts: IntArray,
    codes: npt.NDArray[np.int32],
    seen: IntArray,
    width: IntArray,
    code: IntArray,
    count: IntArray,
) -> int:
    """Count again, in place, those of pools ``mine`` whose generation moved since ``seen``.

    A pool's rows are ``arena[begin[p] : begin[p] + counts[p]]`` (``Pools``);
    its codes (sorted) and how many rows hold each go to ``code[p]`` and
    ``count[p]``, how many codes to ``width[p]``, and ``seen[p]`` takes its
    generation: :func:`member_codes` per pool, the tables ``PoolCodes``
    keeps. Returns 0, or, when a pool holds more codes than the tables
    have columns, that many (the pools counted before it are done; the
    caller widens the tables and calls again for the rest).
    """
    for k in range(len(mine)):
        pool = mine[k]
        if seen[pool] == generation[pool]:
            continue
        start = begin[pool]
        distinct, many = member_codes(arena[start : start + counts[pool]], codes)
        if len(distinct) > code.shape[1]:
            return len(distinct)
        for j in range(len(distinct)):
            code[pool, j] = distinct[j]
            count[pool, j] = many[j]
        width[pool] = len(distinct)
        seen[pool] = generation[pool]
    return 0


@njit(cache=True)
def bound_tally(
    mine: IntArray,
    pool_profile: npt.NDArray[np.int32],
    width: IntArray,
    code: IntArray,
    count: IntArray,
    minus: IntArray,
    plus: IntArray,
    skip: IntArray,
    profile: npt.NDArray[np.integer],
    codes: npt.NDArray[np.int32],
    lookup: IntArray,
    needs: int,
) -> tuple[IntArray, FloatArray]:
    """Machines bound to each need ``lookup`` knows, per profile, from counts kept per pool.

    ``mine`` are a cluster's bound pools; pool ``p`` holds ``count[p, k]``
    rows bound to code ``code[p, k]`` for ``k < width[p]``
    (``PoolCodes``). ``minus`` are rows of those pools not to count (taken
    this cycle), ``plus`` rows counted besides (in flight toward the
    cluster) unless in ``skip`` (sorted). Returns the profiles with any
    machine counted (sorted) and the counts, one column each.
    """
    size = len(minus) + len(plus)
    for k in range(len(mine)):
        size += width[mine[k]]
    at = np.empty(size, dtype=np.int64)
    need_of = np.empty(size, dtype=np.int64)
    delta = np.empty(size, dtype=np.int64)
    n = 0
    for k in range(len(mine)):
        pool = mine[k]
        for j in range(width[pool]):
            c = code[pool, j]
            if c < len(lookup) and lookup[c] >= 0:
                at[n] = pool_profile[pool]
                need_of[n] = lookup[c]
                delta[n] = count[pool, j]
                n += 1
    for k in range(len(minus) + len(plus)):
        row = minus[k] if k < len(minus) else plus[k - len(minus)]
        if row >= len(codes) or codes[row] < 0:
            continue
        c = codes[row]
        if c >= len(lookup) or lookup[c] < 0:
            continue
        if k >= len(minus) and len(skip):
            i = np.searchsorted(skip, row)
            if i < len(skip) and skip[i] == row:
                continue
        at[n] = profile[row]
        need_of[n] = lookup[c]
        delta[n] = -1 if k < len(minus) else 1
        n += 1
    present = np.unique(at[:n])
    out = np.zeros((needs, len(present)))
    for k in range(n):
        out[need_of[k], np.searchsorted(present, at[k])] += delta[k]
    keep = np.zeros(len(present), dtype=np.bool_)
    for j in range(len(present)):
        for i in range(needs):
            if out[i, j] != 0.0:
                keep[j] = True
                break
    return present[keep], out[:, keep]


@njit(cache=True)
def _excess_at(
    matrix: BoolArray, surplus: FloatArray, profile: int, usable: FloatArray, position: int
) -> int:
    best = np.inf
    if profile < matrix.shape[1]:
        for n in range(matrix.shape[0]):
            if not matrix[n, profile]:
                continue
            for d in range(usable.shape[2]):
                amount = usable[n, position, d]
                if amount > 0.0:
                    ratio = np.floor(surplus[n, d] / amount + 1e-9)
                    if ratio < best:
                        best = ratio
    if best >= UNBOUNDED:
        return UNBOUNDED
    return int(best) if best > 0.0 else 0


@njit(cache=True)
def excess(
    matrix: BoolArray, surplus: FloatArray, profiles: IntArray, usable: FloatArray
) -> IntArray:
    """How many machines of each of ``profiles`` could go without any need falling short.

    ``reclaim.excess_groups``: per profile, the least over the needs it
    matches of ``min_d floor(surplus_d / usable_d + 1e-9)`` over resources
    it holds of that need, never below zero; ``UNBOUNDED`` when no need
    bounds it. ``usable[n, i]`` is what one machine of ``profiles[i]``
    holds of need ``n``.
    """
    out = np.empty(len(profiles), dtype=np.int64)
    for i in range(len(profiles)):
        out[i] = _excess_at(matrix, surplus, profiles[i], usable, i)
    return out


@njit(cache=True)
def excess_one(
    matrix: BoolArray, surplus: FloatArray, profile: int, usable: FloatArray, position: int
) -> int:
    """:func:`excess` for the one profile at ``position`` (Phase 3 asks again as it takes)."""
    return _excess_at(matrix, surplus, profile, usable, position)


@njit(cache=True)
def _short(need: FloatArray) -> bool:
    """Whether anything of ``need`` is still missing (any entry not zero)."""
    for j in range(len(need)):  # noqa: SIM110 (a loop compiles; a generator in any() does not pay)
        if need[j] != 0.0:
            return True
    return False


@njit(cache=True)
def _settle(need: FloatArray, slack: FloatArray, shape: FloatArray, machines: int) -> None:
    """Take ``machines`` of ``shape`` off ``need`` in place; what is left within ``slack`` is 0."""
    for j in range(len(need)):
        rest = need[j] - machines * shape[j]
        need[j] = (rest if rest > 0.0 else 0.0) if rest > slack[j] else 0.0


@njit(cache=True)
def cover_units(
    need: FloatArray,
    slack: FloatArray,
    unit: FloatArray,
    left: IntArray,
    shapes: FloatArray,
    prices: FloatArray,
) -> tuple[IntArray, FloatArray]:
    """``selection.cover_by_units``'s greedy cover by cost per unit hosted, compiled.

    ``need`` is the deficit with what lies within ``slack`` already zeroed,
    ``unit`` the need's ``min_unit``, ``left`` machines per group, ``shapes``
    their allocatable, ``prices`` their effective cost. While units or any
    resource are still wanted: each group with machines that hosts a unit
    takes ``k`` machines, the larger of what the units and what the deficit
    call for (at least 1, at most what it has), scored ``k × price ÷ min(k ×
    hosted, units)``; the lowest score wins, ties to the lower price per unit
    hosted, then the lower group. Returns the picks (group, machines) in
    order and the need left. The arithmetic and tie-breaks are the numpy
    code's (``tests/unit/engine/test_kernels.py`` keeps it as the oracle).
    """
    groups, dims = shapes.shape[0], shapes.shape[1]
    need = need.copy()
    left = left.copy()
    hosted = np.zeros(groups, dtype=np.int64)
    asked = False
    for d in range(dims):
        if unit[d] > 0.0:
            asked = True
    if asked:
        for g in range(groups):
            fewest = np.inf
            for d in range(dims):
                if unit[d] > 0.0:
                    fits = np.floor(shapes[g, d] / unit[d] + 1e-9)
                    if fits < fewest:
                        fewest = fits
            hosted[g] = int(fewest) if fewest > 0.0 else 0
    # Units wanted: the most over the resources the unit and the deficit both ask for.
    units = 0
    most = -np.inf
    for d in range(dims):
        if unit[d] > 0.0 and need[d] > 0.0:
            ratio = need[d] / unit[d]
            if ratio > most:
                most = ratio
    if most > -np.inf:
        units = int(np.ceil(most - 1e-9))
    picks = np.empty((16, 2), dtype=np.int64)
    count = 0
    while units > 0 or _any(need):
        best = -1
        best_take = 0
        best_score = 0.0
        best_ratio = 0.0
        for g in range(groups):
            if left[g] <= 0 or hosted[g] <= 0:
                continue
            per = hosted[g]
            by_units = -(-units // per) if units > 0 else 0
            by_need = 0.0
            for d in range(dims):
                if need[d] > 0.0 and shapes[g, d] > 0.0:
                    machines = np.ceil(need[d] / shapes[g, d] - 1e-9)
                    if machines > by_need:
                        by_need = machines
            k = max(max(by_units, int(by_need)), 1)
            if left[g] < k:
                k = left[g]
            covered = k * per
            if units > 0 and units < covered:
                covered = units
            score = k * prices[g] / max(covered, 1)
            ratio = prices[g] / per
            if best < 0 or _sorts_before(score, ratio, best_score, best_ratio):
                best, best_take, best_score, best_ratio = g, k, score, ratio
        if best < 0:
            break
        if count == len(picks):
            grown = np.empty((2 * len(picks), 2), dtype=np.int64)
            grown[:count] = picks
            picks = grown
        picks[count, 0] = best
        picks[count, 1] = best_take
        count += 1
        left[best] -= best_take
        units = units - best_take * hosted[best]
        if units < 0:
            units = 0
        for d in range(dims):
            less = need[d] - best_take * shapes[best, d]
            need[d] = less if less > slack[d] and less > 0.0 else 0.0
    return picks[:count].copy(), need


@njit(cache=True)
def _sorts_before(score: float, ratio: float, best_score: float, best_ratio: float) -> bool:
    """Whether (score, ratio) sorts before the best as ``np.lexsort`` sorts (NaN last)."""
    if math.isnan(score) != math.isnan(best_score):
        return math.isnan(best_score)
    if not math.isnan(score) and score != best_score:
        return score < best_score
    if math.isnan(ratio) != math.isnan(best_ratio):
        return math.isnan(best_ratio)
    return not math.isnan(ratio) and ratio < best_ratio


@njit(cache=True)
def cover(
    need: FloatArray,
    slack: FloatArray,
    left: IntArray,
    shapes: FloatArray,
    prices: FloatArray,
    accelerator: BoolArray,
) -> tuple[IntArray, FloatArray]:
    """``selection.cover_by_cost``'s greedy cover, for a need's few dozen candidate groups.

    ``need`` is the deficit with what lies within ``slack`` already zeroed;
    ``left`` machines per group, ``shapes`` their allocatable, ``prices``
    their effective cost, ``accelerator`` per resource. Repeatedly: the
    dominant resource ``d*`` (an accelerator first, else the most machines
    of the largest shape), then the group with the lowest ``k × price /
    min(k × capacity, need)`` (``k`` the machines the need still takes of
    it, at most what it has), ties to the lower price per unit of ``d*``,
    then the lower group. Returns the picks (group, machines) in order and
    the need left. The arithmetic and tie-breaks are the Python code's
    (``tests/unit/engine/test_kernels.py`` keeps it as the oracle).
    """
    groups, dims = shapes.shape[0], shapes.shape[1]
    need = need.copy()
    left = left.copy()
    picks = np.empty((0, 2), dtype=np.int64)
    # Per d*, the groups offering it, cheapest per unit first (ties to the lower group).
    units = np.full((dims, groups), np.inf)
    orders = np.empty((dims, groups), dtype=np.int64)
    offering = np.full(dims, -1, dtype=np.int64)
    while True:
        if not _short(need):
            break
        live = False
        for g in range(groups):
            if left[g] > 0:
                live = True
        if not live:
            break
        dstar = -1
        best_accelerator = False
        best_ratio = 0.0
        for j in range(dims):
            if need[j] <= 0.0:
                continue
            top = -np.inf
            for g in range(groups):
                if left[g] > 0 and shapes[g, j] > top:
                    top = shapes[g, j]
            if top <= 0.0:
                continue
            ratio = need[j] / top
            if (accelerator[j] and not best_accelerator) or (
                accelerator[j] == best_accelerator and ratio > best_ratio
            ):
                dstar, best_accelerator, best_ratio = j, accelerator[j], ratio
        if dstar < 0:
            break
        if offering[dstar] < 0:
            n = 0
            for g in range(groups):
                if shapes[g, dstar] > 0.0:
                    units[dstar, n] = prices[g] / shapes[g, dstar]
                    orders[dstar, n] = g
                    n += 1
            order = np.argsort(units[dstar, :n], kind="mergesort")  # stable: ties by group
            units[dstar, :n] = units[dstar, :n][order]
            orders[dstar, :n] = orders[dstar, :n][order]
            offering[dstar] = n
        wanted = need[dstar]
        found = False
        best_score, best_unit, best_group, best_take = 0.0, 0.0, -1, 0
        limit = np.inf
        for k in range(offering[dstar]):
            unit = units[dstar, k]
            if unit > limit:
                break
            g = orders[dstar, k]
            have = left[g]
            if have <= 0:
                continue
            capacity = shapes[g, dstar]
            count = 0
            for j in range(dims):
                if need[j] > 0.0 and shapes[g, j] > 0.0:
                    machines = int(np.ceil(need[j] / shapes[g, j] - 1e-9))
                    if machines > count:
                        count = machines
            take = have if have < count else max(count, 1)
            covered = min(take * capacity, wanted)
            price = prices[g]
            score = take * price / covered
            per_unit = price / capacity
            if (
                not found
                or score < best_score
                or (score == best_score and per_unit < best_unit)
                or (score == best_score and per_unit == best_unit and g < best_group)
            ):
                found = True
                best_score, best_unit, best_group, best_take = score, per_unit, g, take
                limit = score * (1 + 1e-9)
        if not found:
            break
        pick = np.empty((1, 2), dtype=np.int64)
        pick[0, 0] = best_group
        pick[0, 1] = best_take
        picks = np.concatenate((picks, pick))
        left[best_group] -= best_take
        _settle(need, slack, shapes[best_group], best_take)
    return picks, need


@njit(cache=True)
def spread_fill(
    need: FloatArray,
    slack: FloatArray,
    left: IntArray,
    shapes: FloatArray,
    prefs: FloatArray,
    signature: npt.NDArray[np.int64],
    queue: IntArray,
    start: IntArray,
    counts: FloatArray,
    eligible: BoolArray,
    hard: IntArray,
    skew: FloatArray,
    max_steps: int,
) -> tuple[IntArray, FloatArray, bool]:
    """``selection.cover_with_spread``'s water-fill: one machine a step into the emptiest domain.

    Groups sharing their domain in every spread share a signature (row
    ``k`` of ``signature``: the domain per spread, -1 for none); ``queue``
    holds each signature's groups, ``start[k]:start[k + 1]``, best
    preference first, then lower group. ``counts``/``eligible`` are the
    spreads' per-domain counts (rows padded), changed in place; ``hard``
    the spreads a step may not unbalance past ``skew``. A step takes one
    machine of the group with the lowest (level of its domains, preference,
    group) among signatures the hard spreads allow and that still hold a
    group able to help. Returns the picks (group, machines) in the order
    groups were first chosen, the need left, and whether a hard spread
    blocked progress. The arithmetic and order are the Python code's.
    """
    groups, dims = shapes.shape[0], shapes.shape[1]
    need = need.copy()
    left = left.copy()
    kinds = len(start) - 1
    spreads = signature.shape[1]
    heads = start[:-1].copy()
    taken = np.zeros(groups, dtype=np.int64)
    first = np.empty(groups, dtype=np.int64)
    chosen = 0
    floors = np.empty(len(hard))
    has_floor = np.zeros(len(hard), dtype=np.bool_)
    blocked = False
    steps = 0
    while steps < max_steps:
        if not _short(need):
            break
        steps += 1
        for h in range(len(hard)):
            i = hard[h]
            has_floor[h] = False
            for d in range(counts.shape[1]):
                if eligible[i, d] and (not has_floor[h] or counts[i, d] < floors[h]):
                    floors[h] = counts[i, d]
                    has_floor[h] = True
        found = False
        best_level, best_pref, best_group, best_kind = 0.0, 0.0, -1, -1
        live = False
        for k in range(kinds):
            head = heads[k]
            while head < start[k + 1]:
                g = queue[head]
                useful = False
                if left[g] > 0:
                    for j in range(dims):
                        if need[j] > 0.0 and shapes[g, j] > 0.0:
                            useful = True
                            break
                if useful:
                    break
                head += 1
            heads[k] = head
            if head == start[k + 1]:
                continue
            live = True
            allowed = True
            for h in range(len(hard)):
                d = signature[k, hard[h]]
                if d < 0 or (has_floor[h] and counts[hard[h], d] + 1 - floors[h] > skew[h]):
                    allowed = False
                    break
            if not allowed:
                continue
            level = 0.0
            for i in range(spreads):
                d = signature[k, i]
                level += counts[i, d] if d >= 0 else 0.0
            g = queue[head]
            if (
                not found
                or level < best_level
                or (level == best_level and prefs[g] < best_pref)
                or (level == best_level and prefs[g] == best_pref and g < best_group)
            ):
                found = True
                best_level, best_pref, best_group, best_kind = level, prefs[g], g, k
        if not live:
            break
        if not found:
            blocked = True
            break
        group = best_group
        if taken[group] == 0:
            first[chosen] = group
            chosen += 1
        taken[group] += 1
        left[group] -= 1
        for i in range(spreads):
            domain = signature[best_kind, i]
            if domain >= 0:
                counts[i, domain] += 1
                eligible[i, domain] = True
        _settle(need, slack, shapes[group], 1)
    picks = np.empty((chosen, 2), dtype=np.int64)
    for c in range(chosen):
        picks[c, 0] = first[c]
        picks[c, 1] = taken[first[c]]
    return picks, need, blocked


@njit(cache=True)
def columns_of(present: IntArray, counts: FloatArray, columns: IntArray) -> FloatArray:
    """``counts`` (one column per profile of ``present``) over the profiles ``columns``.

    Both sorted; a profile of ``columns`` not present counts zero.
    """
    out = np.zeros((counts.shape[0], len(columns)))
    k = 0
    for j in range(len(columns)):
        while k < len(present) and present[k] < columns[j]:
            k += 1
        if k < len(present) and present[k] == columns[j]:
            for i in range(counts.shape[0]):
                out[i, j] = counts[i, k]
    return out


@njit(cache=True)
def usable(shapes: FloatArray, units: FloatArray) -> FloatArray:
    """:func:`shard_engine.usable.usable_shapes`: per need and profile, what a machine holds.

    ``shapes`` (profiles, resources), ``units`` (needs, resources) with zeros
    where a need has no unit; returns (needs, profiles, resources).
    """
    needs, profiles, dims = units.shape[0], shapes.shape[0], shapes.shape[1]
    width = min(units.shape[1], dims)
    out = np.empty((needs, profiles, dims))
    ratio = np.empty(width)
    for n in range(needs):
        has_unit = False
        for d in range(width):
            if units[n, d] > 0.0:
                has_unit = True
        for p in range(profiles):
            for d in range(dims):
                out[n, p, d] = shapes[p, d]
            if not has_unit:
                continue
            fewest = np.inf
            for d in range(width):
                if units[n, d] > 0.0:
                    ratio[d] = np.floor(shapes[p, d] / units[n, d] + 1e-9)
                else:
                    ratio[d] = np.inf
                if ratio[d] < fewest:
                    fewest = ratio[d]
            hosted = _floor0(fewest)
            for d in range(width):
                # The resources that run out first count whole units only.
                if units[n, d] > 0.0 and ratio[d] <= fewest:
                    worth = hosted * units[n, d]
                    out[n, p, d] = worth if worth <= shapes[p, d] else shapes[p, d]
    return out


@njit(cache=True)
def have_rows(weights: FloatArray, usable: FloatArray) -> FloatArray:
    """:func:`shard_engine.usable.have_rows`: per need, the weighted sum over profiles."""
    needs, profiles, dims = usable.shape
    out = np.zeros((needs, dims))
    if profiles == 0:
        return out
    for n in range(needs):
        for d in range(dims):
            total = weights[n, 0] * usable[n, 0, d]
            for p in range(1, profiles):
                total = total + weights[n, p] * usable[n, p, d]
            out[n, d] = total
    return out


def warm() -> None:
    """Compile (or load from the cache) every kernel for the types the engine passes.

    The arrays have the types and layouts ``claims.claim``,
    ``Worksheet.bound`` and ``usable`` pass (the catalog's allocatable as a
    view or whole, the inventory's ``int16`` or widened ``int32`` profile
    column), so a cycle finds each signature compiled.
    """
    # The catalog's allocatable is a view of wider columns, or all of them.
    for alloc in (np.ones((3, 2)), np.ones((3, 4))[:, :2]):
        held, sub, shapes, counts, _ = gather(
            np.ones((2, 3), dtype=np.bool_), np.ones(3, dtype=np.int64), alloc, 3
        )
    for placed, priority in ((NO_PLACED, NO_PRIORITY), (np.ones((2, 3)), np.array([2, 1]))):
        divide(sub, counts, shapes, np.ones((2, 2)), placed, True, held, priority, True)
        for alloc in (np.ones((3, 2)), np.ones((3, 4))[:, :2]):
            claim_all(
                np.ones((2, 3), dtype=np.bool_),
                np.ones(3, dtype=np.int64),
                alloc,
                3,
                np.ones((2, 2)),
                held,
                placed,
                True,
                priority,
                True,
            )
    codes = np.zeros(3, dtype=np.int32)
    lookup = np.zeros(1, dtype=np.int64)
    have_rows(np.ones((2, 3)), usable(shapes, np.ones((2, 2))))
    found, many = member_codes(np.arange(3, dtype=np.int32), codes)
    rows = np.arange(3, dtype=np.int64)
    table = np.zeros((3, 1), dtype=np.int64)
    arena = np.arange(3, dtype=np.int32)
    refresh_codes(rows, rows, arena, rows, rows, codes, rows, rows, table, table)
    for column in (np.zeros(3, dtype=np.int16), np.zeros(3, dtype=np.int32)):
        present, counted = bound_tally(
            found, codes, many, table, table, rows, rows, rows, column, codes, lookup, 1
        )
    columns_of(present, counted, held)
    matrix, surplus = np.ones((2, 3), dtype=np.bool_), np.ones((2, 2))
    excess(matrix, surplus, held, np.ones((2, 3, 2)))
    excess_one(matrix, surplus, 0, np.ones((2, 3, 2)), 0)
    cover(np.ones(2), np.zeros(2), held, np.ones((3, 2)), np.ones(3), np.zeros(2, dtype=np.bool_))
    cover_units(np.ones(2), np.zeros(2), np.ones(2), held, np.ones((3, 2)), np.ones(3))
    spread_fill(
        np.ones(2),
        np.zeros(2),
        held,
        np.ones((3, 2)),
        np.ones(3),
        np.zeros((1, 1), dtype=np.int64),
        held,
        np.array([0, 3], dtype=np.int64),
        np.zeros((1, 2)),
        np.ones((1, 2), dtype=np.bool_),
        np.zeros(1, dtype=np.int64),
        np.ones(1),
        4,
    )
