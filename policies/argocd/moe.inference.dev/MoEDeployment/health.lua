-- Argo CD health check for moe.inference.dev/MoEDeployment (gopher-lua, Lua 5.1 semantics).
-- Order: status lagging the spec -> Progressing; scaled to zero -> Suspended; InvalidSpec or
-- Degraded=True -> Degraded; Ready=True -> Healthy; otherwise Progressing (this includes
-- WaitingForCapacity: the cluster may still free or add nodes; alert MoEWaitingForCapacity
-- pages when it lasts). Messages come from the deciding condition.
local hs = {}

local function describe(c)
  if c.message ~= nil and c.message ~= "" then
    if c.reason ~= nil and c.reason ~= "" then
      return c.reason .. ": " .. c.message
    end
    return c.message
  end
  if c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return c.type .. " is " .. tostring(c.status)
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the MoEDeployment"
  return hs
end

if generation ~= nil and obj.status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation) ..
    " (status is at " .. tostring(obj.status.observedGeneration) .. ")"
  return hs
end

local ready, progressing, degraded, invalid = nil, nil, nil, nil
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.reason == "InvalidSpec" and invalid == nil then
      invalid = c
    end
    if c.type == "Ready" then
      ready = c
    elseif c.type == "Progressing" then
      progressing = c
    elseif c.type == "Degraded" then
      degraded = c
    end
  end
end

if ready ~= nil and ready.reason == "ScaledToZero" then
  hs.status = "Suspended"
  hs.message = describe(ready)
  return hs
end

if invalid ~= nil then
  hs.status = "Degraded"
  hs.message = describe(invalid)
  return hs
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end

if ready ~= nil and ready.status == "True" then
  if ready.observedGeneration ~= nil and generation ~= nil and ready.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Ready condition is from generation " .. tostring(ready.observedGeneration) ..
      ", waiting for generation " .. tostring(generation)
    return hs
  end
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end

hs.status = "Progressing"
if progressing ~= nil and progressing.status == "True" then
  hs.message = describe(progressing)
elseif ready ~= nil then
  hs.message = describe(ready)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
