"""The server-side scripts of the shared state (Lua, run atomically by Redis).

One key per destination holds its fleet state as JSON (``cjson``, built into Redis's
Lua): the learned limit (``limit``, ``credit``, ``last_refusal``, ``refusals``), each
gateway's record (``gws``: its lease expiry by Redis's clock, the leases it holds, its
connections in use and up, its tenants' demand) and the tenants' service (``served``:
grants per weight, fleet-wide). ``SYNC`` is the one call a gateway makes about a
destination: it reports what it has and wants and gets back the fleet's limit, its
target and its leases; the whole decision is one atomic step, with Redis's clock.

``ALLOCATE`` and ``LEARN``/``LEASE`` are the same functions as ``policy.fleetshare`` and
``policy.learned`` (mirrored line for line; ``tests/integration/test_fleet_lua.py``
checks the Lua against the Python on a real redis-server with hypothesis).
"""

from __future__ import annotations

__all__ = ["ALLOCATE_TEST", "LEARN_TEST", "LIBRARY", "SYNC"]

#: the functions shared by the scripts
LIBRARY = r"""
local function allocate(limit, names, wants, held, weight, served, quantum)
  local given = {}
  for _, name in ipairs(names) do given[name] = 0 end
  for _ = 1, limit do
    local bl, bs, bn = nil, nil, nil
    for _, name in ipairs(names) do
      local have = given[name]
      if have < wants[name] then
        local level = have / weight[name]
        local s = served[name] + have / weight[name]
        if held[name] > have then s = s - quantum end
        if bl == nil or level < bl or (level == bl and (s < bs or (s == bs and name < bn))) then
          bl, bs, bn = level, s, name
        end
      end
    end
    if bn == nil then break end
    given[bn] = given[bn] + 1
  end
  return given
end

local function lease(limit, target, others, in_use, bound)
  return math.max(math.min(target, math.max(0, limit - others)), in_use, bound)
end

-- policy.learned.LearnedLimit: refused(open, now) and accepted(in_use, now), n times
local function refused(st, open, now, floor, fixed)
  st.refusals = (st.refusals or 0) + 1
  st.last_refusal = now
  st.credit = 0
  if fixed == 0 then st.limit = math.max(floor, math.min(st.limit, open)) end
end

local function accepted(st, n, in_use, now, ceiling, quiet, fixed)
  if st.last_refusal ~= nil and now - st.last_refusal < quiet then return end
  for _ = 1, n do
    if fixed ~= 0 or in_use < st.limit then return end
    st.credit = (st.credit or 0) + 1
    if st.credit >= st.limit and st.limit < ceiling then
      st.limit = st.limit + 1
      st.credit = 0
    end
  end
end
"""

#: KEYS[1] the destination; ARGV[1] the request (JSON), ARGV[2] the wake channels'
#: prefix, ARGV[3] the destination's name on them. Returns the answer (JSON).
SYNC = (
    LIBRARY
    + r"""
local key = KEYS[1]
local req = cjson.decode(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.call('GET', key)
local st
if raw then st = cjson.decode(raw) else st = {} end
if type(st.gws) ~= 'table' then st.gws = {} end
if type(st.served) ~= 'table' then st.served = {} end
if st.limit == nil then
  -- a limit a gateway remembers (Redis restarted empty) is where the MX refused us last:
  -- a quiet period before probing above it, as policy.learned does after a restart
  if req.known > 0 then st.limit, st.last_refusal = req.known, now else st.limit = req.start end
end
local me = req.gw
-- this gateway's record was lost (Redis restarted empty, or unreachable past a lease's
-- life): what the others hold may be unknown too
local fresh = 0
if st.gws[me] == nil or st.gws[me].exp < now then fresh = 1 end
-- the gateways whose leases expired are gone, with their leases and their demand
for name, g in pairs(st.gws) do
  if name ~= me and g.exp < now then st.gws[name] = nil end
end
if req.leave == 1 then
  st.gws[me] = nil
else
  local old = st.gws[me]
  local held = 0
  if old ~= nil then held = old.lease end
  st.gws[me] = {exp = now + req.ttl, lease = held, u = req.u, up = req.up,
                tenants = req.tenants}
end
-- the learned limit, for the fleet
local fixed = req.fixed
if req.refused >= 0 then
  -- what the MX had of the fleet: the connections up (as last reported), or the leases
  -- but the refused one's (every connection holds one; fresher than the reports)
  local open, leased = req.refused, -1
  for name, g in pairs(st.gws) do
    if name ~= me then open = open + g.up end
    leased = leased + g.lease
  end
  refused(st, math.max(open, leased), now, req.floor, fixed)
end
local total_u = 0
for _, g in pairs(st.gws) do total_u = total_u + g.u end
if req.accepted > 0 then
  accepted(st, req.accepted, total_u, now, req.ceiling, req.quiet, fixed)
end
local limit = st.limit
if fixed > 0 then limit = fixed end
-- the tenants of the fleet: demand summed over the gateways they are seen at
local names, wants, held, weight, parts = {}, {}, {}, {}, {}
local gwnames = {}
for name, _ in pairs(st.gws) do gwnames[#gwnames + 1] = name end
table.sort(gwnames)
for _, gname in ipairs(gwnames) do
  for _, row in ipairs(st.gws[gname].tenants) do
    local tn = row[1]
    if wants[tn] == nil then
      names[#names + 1] = tn
      wants[tn], held[tn], weight[tn], parts[tn] = 0, 0, row[2], {}
    end
    wants[tn] = wants[tn] + row[3] + row[4]
    held[tn] = held[tn] + row[3]
    parts[tn][#parts[tn] + 1] = {gname, row[3] + row[4]}
  end
end
table.sort(names)
-- service: a tenant (re)joining starts level with the least served
local floor_s = nil
for _, tn in ipairs(names) do
  local s = st.served[tn]
  if s ~= nil and (floor_s == nil or s < floor_s) then floor_s = s end
end
local served = {}
for _, tn in ipairs(names) do
  served[tn] = st.served[tn] or floor_s or 0
end
if req.leave ~= 1 then
  for _, row in ipairs(req.tenants) do
    served[row[1]] = served[row[1]] + row[5]
  end
end
st.served = served
local given = allocate(limit, names, wants, held, weight, served, req.quantum)
-- each gateway's target: its tenants' allocations (split in name order if shared)
local target = {}
for _, gname in ipairs(gwnames) do target[gname] = 0 end
for _, tn in ipairs(names) do
  local left = given[tn]
  for _, part in ipairs(parts[tn]) do
    local take = math.min(left, part[2])
    target[part[1]] = target[part[1]] + take
    left = left - take
  end
end
local answer = {limit = limit, learned = st.limit, refusals = st.refusals or 0,
                alive = #gwnames, in_use = total_u, target = 0, lease = 0, fresh = fresh}
if req.leave ~= 1 then
  local mine = st.gws[me]
  local others = 0
  for name, g in pairs(st.gws) do
    if name ~= me then others = others + g.lease end
  end
  mine.lease = lease(limit, target[me], others, req.u, req.bound)
  answer.target = target[me]
  answer.lease = mine.lease
end
-- wake the gateways that should act now: one that wants more while leases are free,
-- one that holds more than its target while another wants more
local leased = 0
for _, g in pairs(st.gws) do leased = leased + g.lease end
local wanting = false
for name, g in pairs(st.gws) do
  if target[name] > g.lease then wanting = true end
end
for name, g in pairs(st.gws) do
  if name ~= me then
    local more = target[name] > g.lease and leased < limit
    local less = g.lease > target[name] and wanting
    if more or less then redis.call('PUBLISH', ARGV[2] .. name, ARGV[3]) end
  end
end
local alloc = {}
for _, tn in ipairs(names) do alloc[tn] = given[tn] end
answer.alloc = alloc
redis.call('SET', key, cjson.encode(st), 'PX', 604800000)
return cjson.encode(answer)
"""
)

#: the allocation alone, for the test against ``policy.fleetshare.allocate``:
#: ARGV[1] {limit, quantum, tenants: [[name, held, waiting, weight, served]...]}
ALLOCATE_TEST = (
    LIBRARY
    + r"""
local req = cjson.decode(ARGV[1])
local names, wants, held, weight, served = {}, {}, {}, {}, {}
for _, row in ipairs(req.tenants) do
  local tn = row[1]
  names[#names + 1] = tn
  held[tn], wants[tn], weight[tn], served[tn] = row[2], row[2] + row[3], row[4], row[5]
end
table.sort(names)
local given = allocate(req.limit, names, wants, held, weight, served, req.quantum)
local out = {}
for _, tn in ipairs(names) do out[#out + 1] = {tn, given[tn]} end
local leases = {}
for _, row in ipairs(req.leases or {}) do
  leases[#leases + 1] = lease(row[1], row[2], row[3], row[4], row[5])
end
return cjson.encode({given = out, leases = leases})
"""
)

#: the learned limit alone, for the test against ``policy.learned.LearnedLimit``:
#: ARGV[1] {limit, floor, ceiling, quiet, fixed, steps: [["r", open, now] | ["a", in_use, now]]}
LEARN_TEST = (
    LIBRARY
    + r"""
local req = cjson.decode(ARGV[1])
local st = {limit = req.limit}
local out = {}
for _, step in ipairs(req.steps) do
  if step[1] == 'r' then
    refused(st, step[2], step[3], req.floor, req.fixed)
  else
    accepted(st, 1, step[2], step[3], req.ceiling, req.quiet, req.fixed)
  end
  out[#out + 1] = st.limit
end
return cjson.encode(out)
"""
)
