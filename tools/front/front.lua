-- The front's few rules that HAProxy's own keywords cannot express (tools/front/haproxy_config.py
-- loads this file; docs/serving.md says why each exists).
--
-- gRPC refusals are answered as gRPC: a trailers-only response (HTTP 200, grpc-status in the
-- headers, END_STREAM), sent once the request is read, so the client sees the gRPC status and
-- not the stream reset HAProxy's own early answers end with (CANCELLED). What is read is
-- dropped: a refused message never reaches tritonserver and is never held in memory.

local function drain(applet)
    while true do
        local chunk = applet:receive(1048576)
        if chunk == nil or #chunk == 0 then
            return
        end
    end
end

local function grpc_status(applet, code, message, extra)
    drain(applet)
    applet:set_status(200)
    applet:add_header("content-type", "application/grpc")
    applet:add_header("grpc-status", tostring(code))
    applet:add_header("grpc-message", message)
    for name, value in pairs(extra or {}) do
        applet:add_header(name, value)
    end
    applet:start_response()
end

-- A message over the limit: RESOURCE_EXHAUSTED (8), as a gRPC server over its receive limit.
core.register_service("grpc_too_large", "http", function(applet)
    grpc_status(applet, 8, "message of " .. (applet:get_var("txn.length") or "?") ..
        " bytes is over the front's limit of " .. (applet:get_var("txn.limit") or "?") .. " bytes")
end)

-- A compressed message: UNIMPLEMENTED (12); the front cannot bound what it decodes to.
core.register_service("grpc_compressed", "http", function(applet)
    grpc_status(applet, 12, "compressed messages are not accepted: send them uncompressed")
end)

-- Over the model's in-flight cap: UNAVAILABLE (14) with retry pushback, after the hold.
core.register_service("grpc_overloaded", "http", function(applet)
    local hold = tonumber(applet:get_var("txn.hold_ms")) or 0
    if hold > 0 then
        core.msleep(hold)
    end
    grpc_status(applet, 14, "model '" .. (applet:get_var("txn.model") or "?") ..
        "' is over its latency target (P99 objective " .. (applet:get_var("txn.p99_ms") or "?") ..
        " ms); retry later", {["grpc-retry-pushback-ms"] = tostring(math.max(hold, 1))})
end)

-- A KServe v2 JSON shape that promises more elements than the body has bytes: every element
-- takes at least one byte, so such a request cannot be valid, and Triton 2.51 aborts
-- (std::bad_alloc) sizing some of them. Reads the part of the body HAProxy holds (its first
-- 16 KB, where the inputs' shapes are) and, for a binary-tensor request, only its JSON header.
core.register_action("check_shapes", {"http-req"}, function(txn)
    local body = txn.f:req_body()
    if body == nil or #body == 0 then
        return
    end
    local header = tonumber(txn.f:req_hdr("inference-header-content-length") or "")
    if header ~= nil and header < #body then
        body = body:sub(1, header)
    end
    local size = tonumber(txn.f:req_hdr("content-length") or "") or #body
    for dims in body:gmatch('"shape"%s*:%s*%[([^%]]*)%]') do
        local elements = 1.0  -- a float: integer products wrap around in Lua 5.3
        for dim in dims:gmatch("[^,%s]+") do
            local value = tonumber(dim)
            if value == nil or value < 0 then
                elements = nil  -- not a shape Triton will size: it refuses it itself
                break
            end
            elements = elements * value
        end
        if elements ~= nil and elements > size then
            txn:set_var("txn.shape_error", string.format(
                "shape [%s] has %.0f elements, more than the request body's %d bytes can hold",
                dims:gsub("%s", ""), elements, size))
            return
        end
    end
end)

-- Admission: each model backend admits a request while the bytes in flight to it stay within
-- its cap, or while fewer than its floor of requests are in flight (tools/front/admission.py:
-- requests are weighed by their size, as the work they bring is; the floor is MIN_IN_FLIGHT).
-- The controller sets each cap through the runtime API (`forge cap`); until it has, a backend
-- admits COLD_FLOOR requests whatever their size.
-- A request is counted from `lua.admit` (http-request) to `lua.release` (http-response), also
-- when its client has left (HAProxy still waits for tritonserver's answer); one that gets no
-- response from the server (HAProxy answered 502/504 itself, the connection broke) is dropped
-- by the sweep once the server holds fewer requests than are counted.
local COLD_FLOOR = 32  -- tools/front/admission.py INITIAL_IN_FLIGHT
local SERVER = "triton"  -- the server of every model backend (haproxy_config.py)
local SWEEP_S = 0.5
local SETTLE_S = 1.0  -- a counted request this old must be on the server (or be gone)

local caps = {}  -- backend -> {bytes, floor, requests}
local flights = {}  -- backend -> {bytes, count, held = {id -> {cost, since}}}
local last_id = 0

local function now_s()
    local now = core.now()
    return now.sec + now.usec / 1e6
end

local function flight_of(backend)
    local flight = flights[backend]
    if flight == nil then
        flight = {bytes = 0, count = 0, held = {}}
        flights[backend] = flight
    end
    return flight
end

core.register_action("admit", {"http-req"}, function(txn)
    local backend = txn.f:be_name()
    local cost = tonumber(txn:get_var("txn.cost")) or 0
    local cap = caps[backend]
    local flight = flight_of(backend)
    local floor = cap and cap.floor or COLD_FLOOR
    if flight.count >= floor and flight.bytes + cost > (cap and cap.bytes or 0) then
        txn:set_var("txn.over", 1)
        return
    end
    last_id = last_id + 1
    flight.held[last_id] = {cost = cost, since = now_s()}
    flight.bytes = flight.bytes + cost
    flight.count = flight.count + 1
    txn:set_var("txn.admitted", last_id)
end)

local function release(flight, id)
    local entry = flight.held[id]
    if entry ~= nil then
        flight.held[id] = nil
        flight.bytes = math.max(0, flight.bytes - entry.cost)
        flight.count = math.max(0, flight.count - 1)
    end
end

core.register_action("release", {"http-res"}, function(txn)
    local id = tonumber(txn:get_var("txn.admitted"))
    local flight = flights[txn.f:be_name()]
    if id ~= nil and flight ~= nil then
        release(flight, id)
    end
end)

local function sweep()
    local now = now_s()
    for backend, flight in pairs(flights) do
        local proxy = core.backends[backend]
        local server = proxy and proxy.servers[SERVER]
        local on_server = server and tonumber(server:get_stats()["scur"])
        if on_server ~= nil and flight.count > on_server then
            local settled = {}
            for id, entry in pairs(flight.held) do
                if now - entry.since >= SETTLE_S then
                    settled[#settled + 1] = id
                end
            end
            table.sort(settled)  -- ids grow with time: the oldest first
            for i = 1, math.min(#settled, flight.count - on_server) do
                release(flight, settled[i])
            end
        end
    end
end

core.register_task(function()
    while true do
        core.msleep(math.floor(SWEEP_S * 1000))
        sweep()
    end
end)

-- forge cap BACKEND BYTES FLOOR REQUESTS: admit while the bytes in flight stay within BYTES,
-- or while fewer than FLOOR requests are in flight (REQUESTS: the cap in requests of the mean
-- size, shown by `forge caps`).
core.register_cli({"forge", "cap"}, "forge cap <backend> <bytes> <floor> <requests>: set a model's admission cap",
    function(applet, _, _, backend, bytes, floor, requests)
        bytes, floor, requests = tonumber(bytes), tonumber(floor), tonumber(requests)
        if backend == nil or core.backends[backend] == nil or bytes == nil or floor == nil then
            applet:send("forge cap: no such backend or not numbers: " .. tostring(backend) .. "\n")
            return
        end
        caps[backend] = {bytes = bytes, floor = floor, requests = requests or floor}
    end)

-- forge caps: one line per model backend: backend, cap in bytes, floor, cap in requests, bytes
-- and requests in flight.
core.register_cli({"forge", "caps"}, "forge caps: each model's admission cap and what is in flight",
    function(applet)
        local names = {}
        for backend in pairs(core.backends) do
            if (backend:sub(1, 2) == "h_" or backend:sub(1, 2) == "g_") and
                    backend ~= "h_triton" and backend ~= "g_triton" then
                names[#names + 1] = backend
            end
        end
        table.sort(names)
        for _, backend in ipairs(names) do
            local cap = caps[backend] or {bytes = 0, floor = COLD_FLOOR, requests = COLD_FLOOR}
            local flight = flight_of(backend)
            applet:send(string.format("%s %d %d %d %d %d\n", backend, cap.bytes, cap.floor,
                cap.requests, flight.bytes, flight.count))
        end
    end)
