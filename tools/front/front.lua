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
