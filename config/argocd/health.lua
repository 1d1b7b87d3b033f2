-- Argo CD health check for serving.kvroute.io/KVRoutedModel.
-- Order matters: a status the controller has not caught up with says nothing, so an older
-- observedGeneration is Progressing whatever its conditions say.
hs = {}
if obj.status == nil or obj.status.observedGeneration == nil
    or obj.metadata.generation == nil
    or obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe the latest generation"
  return hs
end
-- IndexHealthy=False alone leaves the model Healthy (routing goes on by load) and is named in
-- the message; when a replica's keys may be wrong the operator also sets Degraded (IndexUnhealthy).
local ready, degraded, index = nil, nil, nil
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Ready" then ready = c end
    if c.type == "Degraded" then degraded = c end
    if c.type == "IndexHealthy" then index = c end
  end
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. (degraded.message or "")
  return hs
end
if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "spec.suspend is set: the operator leaves the children as they are"
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  if index ~= nil and index.status == "False" then
    hs.message = hs.message .. "; index unhealthy: " .. (index.message or "")
  end
  return hs
end
hs.status = "Progressing"
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = "Waiting for Ready"
end
return hs
