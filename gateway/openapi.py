"""The API contract: an OpenAPI 3.1 document of every route, its bodies, its SSE events and its
error shape, served at /openapi.json (the bodies' schemas: gateway/openapi_schemas.py). A test
holds it and the gateway's route table in agreement, and a property-based run checks the server
against it."""
from __future__ import annotations

from typing import Any

from actors.flow_queues import MAX_KEY
from broker.protocol import RUN_STATUSES
from gateway.openapi_schemas import ANY, ID, NAME, SCHEMAS, ref


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: int) -> dict:
    text = {400: "Bad input", 401: "Missing or unknown API key", 404: "Not found (or another tenant's)",
            405: "Method not allowed", 409: "Conflict", 413: "Body or input too large", 422: "Handler failed",
            429: "Over the admission limit (see Retry-After)", 502: "Upstream error",
            503: "Unavailable or draining (see Retry-After)", 507: "Storage full"}
    return {str(s): {"description": text[s], "content": _json(ref("Error"))} for s in statuses}


def _param(name: str, schema: dict, where: str = "path", required: bool = True, description: str = "") -> dict:
    return {"name": name, "in": where, "required": required, "schema": schema, "description": description}


SID = _param("sid", ID, description="session id (namespaced per tenant)")
RUN = _param("run_id", NAME, description="run id (namespaced per tenant)")
SCHEDULE = _param("name", {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,149}$"},
                  description="the schedule's name (per tenant)")
AFTER = _param("after", {"type": "integer", "minimum": -1, "maximum": 2 ** 62}, "query", False,
               "cursor: return what comes after it")
LIMIT = _param("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "query", False)
PAGE_BOTH_WAYS = [_param("before", {"type": "integer", "minimum": 0, "maximum": 2 ** 62}, "query", False,
                         "cursor: return what comes before it"),
                  _param("order", {"enum": ["asc", "desc"]}, "query", False,
                         "asc (default): oldest first, the next page after `next_after`; desc: newest first, "
                         "the next page before `next_before`")]

SSE_EVENTS = {
    "turn.started": {"type": "object", "required": ["turn_id", "session_id"],
                     "properties": {"turn_id": {"type": "string"}, "session_id": {"type": "string"}}},
    "delta": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
    "tool": {"type": "object", "required": ["phase", "name"],
             "properties": {"phase": {"enum": ["call", "approval", "result"]}, "name": {"type": "string"},
                            "until": {"type": "number"},
                            "call_id": {"type": "string"}, "arguments": {"type": "string"}, "ok": {"type": "boolean"},
                            "result": ANY, "error": {"type": "string"}}},
    "turn.completed": {"type": "object", "required": ["turn_id", "usage", "durations"],
                       "properties": {"turn_id": {"type": "string"}, "session_id": {"type": "string"},
                                      "usage": {"type": "object"}, "durations": {"type": "object"},
                                      "finish_reason": {"type": "string"}, "steps": {"type": "integer"}}},
    "turn.failed": {"type": "object", "required": ["turn_id", "error"],
                    "properties": {"turn_id": {"type": "string"}, "error": ref("ErrorBody")}},
    "turn.cancelled": {"type": "object", "required": ["turn_id", "reason"],
                       "properties": {"turn_id": {"type": "string"}, "reason": {"type": "string"}}},
    "turn.interrupted": {"type": "object", "required": ["turn_id", "code", "message"],
                         "properties": {"turn_id": {"type": "string"}, "code": {"type": "string"},
                                        "message": {"type": "string"}}},
}
SSE_RESPONSE = {"description": (
    "Server-Sent Events, each with `id:` (its sequence number in the turn), `event:` and a JSON `data:`. "
    "Events: turn.started, delta, tool, then exactly one of turn.completed, turn.failed, turn.cancelled, "
    "turn.interrupted. Comments (`: keep-alive`) may appear. The data of each event is described by "
    "`x-sse-events`."),
    "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["event", "data"],
        "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"enum": list(SSE_EVENTS)},
                       "data": {"type": "string", "contentMediaType": "application/json"}}}}},
    "x-sse-events": SSE_EVENTS}

PATHS: dict[str, dict] = {
    "/v1/sessions": {"post": {"summary": "A new session id", "responses": {
        "201": {"description": "created", "content": _json(ref("Session"))}, **_errors(401)}},
                     "get": {"summary": "The sessions that hold a transcript or a checkpoint, by id or the most "
                                        "recently active first",
                             "parameters": [_param("after", ID, "query", False,
                                                   "cursor: the sessions after this id"),
                                            _param("order", {"enum": ["id", "recent"]}, "query", False,
                                                   "id (default): by id, the next page after `next_after`; recent: "
                                                   "the most recently active first, the next page before "
                                                   "`next_before`"),
                                            _param("before", {"type": "string", "maxLength": 200}, "query", False,
                                                   "cursor, with order=recent: a `next_before`"), LIMIT],
                             "responses": {"200": {"description": "a page of sessions",
                                                   "content": _json(ref("Sessions"))},
                                           **_errors(400, 401, 503)}}},
    "/v1/sessions/{sid}/turns": {"post": {
        "summary": "Run a turn: the reply streams back as Server-Sent Events (with an Idempotency-Key, a start "
                   "sent again streams the turn the first began, from its first event; 409 once it has left "
                   "memory, or with another input)",
        "parameters": [SID, _param("Idempotency-Key", {"type": "string", "minLength": 1, "maxLength": 200},
                                   "header", False)],
        "requestBody": {"required": True, "content": _json(ref("TurnInput"))},
        "responses": {"200": SSE_RESPONSE, **_errors(400, 401, 409, 413, 429, 503)}}},
    "/v1/sessions/{sid}": {"get": {
        "summary": "One session: its message count, first and last activity, and its running turn (follow its "
                   "stream again with GET /v1/sessions/{sid}/turns/{turn_id}/events, unless `resumed`: finishing "
                   "after its actor's restart, with no stream to follow)",
        "parameters": [SID],
        "responses": {"200": {"description": "the session", "content": _json(ref("SessionState"))},
                      **_errors(400, 401, 404, 503)}}, "delete": {
        "summary": "Close a session: its running turn is cancelled, and its transcript, events and checkpoints "
                   "are gone for every read once this answers (and leave the disk with the log's compaction); "
                   "the id may be used again, starting empty (a turn posted while the close is under way "
                   "starts once it is done)",
        "parameters": [SID],
        "responses": {"204": {"description": "closed (also when it had nothing)"}, **_errors(400, 401, 503, 507)}}},
    "/v1/sessions/{sid}/fork": {"post": {
        "summary": "A new session that begins with the first messages of this one (all of them, less a tool call "
                   "whose results are not all in, if `messages` is not given); the original is untouched. The "
                   "body may be empty",
        "parameters": [SID],
        "requestBody": {"required": False, "content": _json(ref("SessionFork"))},
        "responses": {"201": {"description": "the new session", "content": _json(ref("SessionForked"))},
                      **_errors(400, 401, 404, 409, 503, 507)}}},
    "/v1/sessions/{sid}/turns/current": {"delete": {
        "summary": "Cancel the running turn", "parameters": [SID],
        "responses": {"200": {"description": "cancelled", "content": _json(ref("Cancelled"))},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/sessions/{sid}/turns/{turn_id}/events": {"get": {
        "summary": "Resume a turn's stream after the client's last event (Last-Event-ID or ?after)",
        "parameters": [SID, _param("turn_id", ID),
                       _param("Last-Event-ID", {"type": "string", "pattern": "^[0-9]{1,18}$"}, "header", False),
                       _param("after", {"type": "integer", "minimum": 0, "maximum": 2 ** 62}, "query", False)],
        "responses": {"200": SSE_RESPONSE,
                      "204": {"description": "the turn has ended and the client has every event, its last too"},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}": {"post": {
        "summary": "Answer a tool call the turn waits on before running it (its `tool` event of phase `approval`): "
                   "approved, it runs; not, the model reads that it was not, and why",
        "parameters": [SID, _param("turn_id", ID), _param("call_id", {"type": "string", "minLength": 1})],
        "requestBody": {"required": True, "content": _json(ref("ApprovalAnswer"))},
        "responses": {"200": {"description": "journaled, and acted on", "content": _json({
            "type": "object", "required": ["turn_id", "call_id", "approved"],
            "properties": {"turn_id": {"type": "string"}, "call_id": {"type": "string"},
                           "approved": {"type": "boolean"}}})},
                      **_errors(400, 401, 404, 409, 503, 507)}}},
    "/v1/sessions/{sid}/messages": {"get": {
        "summary": "The session's transcript", "parameters": [SID, AFTER, LIMIT, *PAGE_BOTH_WAYS],
        "responses": {"200": {"description": "a page of messages", "content": _json(ref("Messages"))},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/sessions/{sid}/events": {"get": {
        "summary": "The session's events (turns and steps)",
        "parameters": [SID, AFTER, LIMIT, *PAGE_BOTH_WAYS, _param("turn", ID, "query", False)],
        "responses": {"200": {"description": "a page of events", "content": _json(ref("Events"))},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/sessions/{sid}/checkpoints/{key}": {"put": {
        "summary": "Store a checkpoint; answered once it is durable", "parameters": [SID, _param("key", NAME)],
        "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {
            "type": "string", "format": "binary"}}}},
        "responses": {"200": {"description": "durable", "content": _json(ref("CheckpointSaved"))},
                      **_errors(400, 401, 413, 503, 507)}}},
    "/v1/sessions/{sid}/checkpoints/latest": {"get": {
        "summary": "The newest checkpoint (its bytes)", "parameters": [SID],
        "responses": {"200": {"description": "the checkpoint; X-Checkpoint-Key and X-Checkpoint-Seq headers",
                              "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                  "format": "binary"}}}},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/flows/{flow}/runs": {"post": {
        "summary": "Start a run of a flow (Idempotency-Key: a repeated start returns the same run)",
        "parameters": [_param("flow", NAME), _param("Idempotency-Key", {"type": "string", "minLength": 1,
                                                                         "maxLength": 200}, "header", False)],
        "requestBody": {"required": True, "content": _json(ref("RunStart"))},
        "responses": {"201": {"description": "started", "content": _json(ref("Run"))},
                      "200": {"description": "already started", "content": _json(ref("Run"))},
                      **_errors(400, 401, 409, 413, 503, 507)}}},
    "/v1/runs": {"get": {
        "summary": "The flow runs, by id (a page filtered by flow or by status may hold fewer than limit "
                   "and still name the next: the listing ends where next_after, or next_before, is null)",
        "parameters": [_param("after", NAME, "query", False, "cursor: the runs after this id"),
                       _param("before", NAME, "query", False, "cursor, with order=desc: the runs before this id"),
                       _param("order", {"enum": ["asc", "desc"]}, "query", False,
                              "asc (default): by id, the next page after `next_after`; desc: from the last id "
                              "down (the newest first, of ids the server made), the next page before "
                              "`next_before`"),
                       _param("flow", NAME, "query", False, "only runs of this flow"),
                       _param("queue", NAME, "query", False, "only runs that wait or waited in this flow queue"),
                       _param("queue_key", {"type": "string", "minLength": 1, "maxLength": MAX_KEY}, "query", False,
                              "only runs with this key in a queue per key"),
                       _param("schedule", NAME, "query", False, "only runs this schedule started"),
                       _param("started_after", {"type": "number"}, "query", False,
                              "only runs started at or after this time (UNIX seconds)"),
                       _param("started_before", {"type": "number"}, "query", False,
                              "only runs started before this time (UNIX seconds)"),
                       _param("status", {"type": "string", "enum": list(RUN_STATUSES)},
                              "query", False, "only runs in this state (open: scheduled, enqueued or running)"), LIMIT],
        "responses": {"200": {"description": "a page of runs", "content": _json(ref("Runs"))},
                      **_errors(400, 401, 503)}}},
    "/v1/runs/{run_id}": {"get": {
        "summary": "A run's status and result",
        "parameters": [RUN, _param("wait", {"type": "number", "minimum": 0, "maximum": 60}, "query", False,
                                   "seconds to wait for the run to end"),
                       _param("until", {"type": "string", "enum": ["suspended"]}, "query", False,
                              "with wait: answer as soon as the run is suspended (waiting for a message, "
                              "a timer or a child) rather than only when it ends")],
        "responses": {"200": {"description": "the run", "content": _json(ref("Run"))},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/runs/{run_id}:cancel": {"post": {
        "summary": "Cancel a run", "parameters": [RUN],
        "responses": {"200": {"description": "the run", "content": _json(ref("Run"))},
                      **_errors(400, 401, 404, 503, 507)}}},
    "/v1/runs/{run_id}:fork": {"post": {
        "summary": "A new run of this run's flow and input that replays its operations before from_seq (default: "
                   "its first that did not succeed) and runs on from there; the body may be empty",
        "parameters": [RUN, _param("Idempotency-Key", {"type": "string", "minLength": 1, "maxLength": 200},
                                   "header", False, "the same key again answers the same fork")],
        "requestBody": {"required": False, "content": _json(ref("Fork"))},
        "responses": {"200": {"description": "the fork, made before by the same request",
                              "content": _json(ref("Run"))},
                      "201": {"description": "the fork, started", "content": _json(ref("Run"))},
                      **_errors(400, 401, 404, 409, 503, 507)}}},
    "/v1/runs/{run_id}/steps": {"get": {
        "summary": "The run's operations in order (steps, sleeps, waits, children, attribute writes) with their "
                   "state, attempts, times and outcome",
        "parameters": [RUN, _param("after", {"type": "integer", "minimum": -1, "maximum": 2 ** 31}, "query", False,
                                   "cursor: the operations after this seq"), LIMIT],
        "responses": {"200": {"description": "a page of the run's operations", "content": _json(ref("Steps"))},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/runs/{run_id}/emitted": {"get": {
        "summary": "The values the run emitted (ctx.emit), in order, a page at a time by seq; with "
                   "`Accept: text/event-stream`, followed as server-sent events (`emitted`, then `run.ended` "
                   "with the run's status and result or error) from `Last-Event-ID` or `after`",
        "parameters": [RUN, _param("after", {"type": "integer", "minimum": -1, "maximum": 2 ** 31}, "query", False,
                                   "cursor: the values after this seq"), LIMIT,
                       _param("wait", {"type": "integer", "minimum": 0, "maximum": 60}, "query", False,
                              "seconds to wait for a value if none is there yet (or the run's end)"),
                       _param("Last-Event-ID", {"type": "string", "pattern": "^-?[0-9]+$"}, "header", False,
                              "a followed stream goes on after this seq")],
        "responses": {"200": {"description": "a page of the run's emitted values (or, asked for, their stream)",
                              "content": {**_json(ref("Emitted")), "text/event-stream": {"schema": {
                                  "type": "object", "required": ["event", "data"],
                                  "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"},
                                                 "event": {"enum": ["emitted", "run.ended", "error"]},
                                                 "data": {"type": "string",
                                                          "contentMediaType": "application/json"}}}}}},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/runs/{run_id}/attributes": {"get": {
        "summary": "Read attributes (no worker involved)",
        "parameters": [RUN, _param("keys", {"type": "string"}, "query", False, "comma-separated")],
        "responses": {"200": {"description": "the attributes", "content": _json(ref("Attributes"))},
                      **_errors(400, 401, 404, 503)}}},
    "/v1/runs/{run_id}/attributes/{key}:update": {"post": {
        "summary": "Update an attribute with a handler, under the run's lock (409 once the run has ended)",
        "parameters": [RUN, _param("key", NAME)],
        "requestBody": {"required": True, "content": _json(ref("Update"))},
        "responses": {"200": {"description": "the new value", "content": _json(ref("Updated"))},
                      **_errors(400, 401, 404, 409, 413, 422, 503, 507)}}},
    "/v1/runs/{run_id}/channels/{channel}": {"post": {
        "summary": "Publish a message to a run's channel (Idempotency-Key: the run takes one message per key, "
                   "and a publish again of a key it took is answered 202 as the first)",
        "parameters": [RUN, _param("channel", NAME), _param("Idempotency-Key", {"type": "string", "minLength": 1,
                                                                                "maxLength": 200}, "header", False)],
        "requestBody": {"required": True, "content": _json(ref("Publish"))},
        "responses": {"202": {"description": "published", "content": _json(ref("Published"))},
                      **_errors(400, 401, 404, 409, 413, 503, 507)}}},
    "/v1/channels/{channel}": {"post": {
        "summary": "Publish a message to every run of the tenant waiting on this channel now (a `ctx.wait` or "
                   "`ctx.wait_any` of it), of `flow` and with the attribute values `where` names, each durably "
                   "before the answer; a run not waiting on it does not get it (Idempotency-Key: a run takes it "
                   "once, so after a 503 the same key again reaches the others)",
        "parameters": [_param("channel", NAME), _param("Idempotency-Key", {"type": "string", "minLength": 1,
                                                                           "maxLength": 200}, "header", False)],
        "requestBody": {"required": True, "content": _json(ref("Broadcast"))},
        "responses": {"200": {"description": "how many runs took it", "content": _json(ref("Broadcasted"))},
                      **_errors(400, 401, 413, 503, 507)}},
        "get": {
        "summary": "The runs of the tenant a publish to this channel would reach now (of `flow`): how many, and "
                   "the `limit` that have waited longest, those first",
        "parameters": [_param("channel", NAME), _param("flow", NAME, "query", False),
                       _param("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "query", False)],
        "responses": {"200": {"description": "the runs waiting on it", "content": _json(ref("ChannelWaiters"))},
                      **_errors(400, 401, 503)}}},
    "/v1/queues": {"get": {
        "summary": "The flow queues (kernel.flow_queues): each one's limit and rate, runs admitted and runs waiting",
        "responses": {"200": {"description": "every queue", "content": _json({
            "type": "object", "required": ["queues"], "properties": {"queues": {"type": "array", "items": {
                "type": "object", "required": ["name", "limit", "running", "waiting", "rate", "per", "own"],
                "properties": {"name": {"type": "string"},
                               "limit": {"type": ["integer", "null"], "description": "runs at once (null: no limit)"},
                               "running": {"type": "integer"}, "waiting": {"type": "integer"},
                               "rate": {"type": ["object", "null"], "required": ["starts", "per_secs", "started"],
                                        "description": "at most `starts` runs admitted in any `per_secs`; "
                                                       "`started`: those admitted in the last `per_secs`",
                                        "properties": {"starts": {"type": "integer"}, "per_secs": {"type": "number"},
                                                       "started": {"type": "integer"}}},
                               "per": {"enum": ["key", "tenant", None], "description": "the limit and rate hold for each "
                                                                      "queue_key (tenant) apart"},
                               "keys": {"type": "integer", "description": "a queue per key's (tenant's) keys with "
                                                                          "runs running or waiting"},
                               "own": {"type": "object", "required": ["running", "waiting"],
                                       "description": "the caller's (its tenant's) runs among `running` and `waiting`",
                                       "properties": {"running": {"type": "integer"},
                                                      "waiting": {"type": "integer"}}}}}}}})},
                      **_errors(401, 503)}}},
    "/v1/workers": {"get": {
        "summary": "The workers connected now (they serve every tenant): what each runs, its slots and tasks",
        "responses": {"200": {"description": "every worker, by name", "content": _json({
            "type": "object", "required": ["workers"], "properties": {"workers": {"type": "array", "items": {
                "type": "object",
                "required": ["name", "flows", "tools", "update_handlers", "slots", "running", "draining", "up_secs",
                             "seen_secs_ago"],
                "properties": {"name": {"type": "string"},
                               "flows": {"type": "array", "items": {"type": "string"}},
                               "tools": {"type": "array", "items": {"type": "string"}},
                               "update_handlers": {"type": "array", "items": {"type": "string"}},
                               "slots": {"type": "integer", "description": "tasks it runs at once (0 while draining)"},
                               "running": {"type": "integer", "description": "tasks it was given and runs"},
                               "draining": {"type": "boolean", "description": "stopping (`--drain`): it takes no new "
                                                                              "task while those it runs end"},
                               "up_secs": {"type": "number"},
                               "seen_secs_ago": {"type": "number", "description": "since its last hello "
                                                                                  "(gone after 3 s of silence)"}}}}}})},
                      **_errors(401, 503)}}},
    "/v1/schedules": {"get": {
        "summary": "The tenant's schedules, by name",
        "parameters": [_param("after", NAME, "query", False, "cursor: the schedules after this name"),
                       _param("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "query", False)],
        "responses": {"200": {"description": "a page", "content": _json(ref("Schedules"))},
                      **_errors(400, 401, 503)}}},
    "/v1/schedules/{name}": {"put": {
        "summary": "Create a schedule, or change it: at each time its cron expression matches, a run of its flow "
                   "and input starts, named <name>-<UTC time> (20261206T090000Z), once per time",
        "parameters": [SCHEDULE],
        "requestBody": {"required": True, "content": _json(ref("ScheduleDefinition"))},
        "responses": {"201": {"description": "created", "content": _json(ref("Schedule"))},
                      "200": {"description": "changed, or already so", "content": _json(ref("Schedule"))},
                      **_errors(400, 401, 413, 503, 507)}}, "get": {
        "summary": "A schedule and its next time", "parameters": [SCHEDULE],
        "responses": {"200": {"description": "the schedule", "content": _json(ref("Schedule"))},
                      **_errors(400, 401, 404, 503)}}, "delete": {
        "summary": "Delete a schedule: it starts nothing more (the runs it started go on)", "parameters": [SCHEDULE],
        "responses": {"204": {"description": "deleted"}, **_errors(400, 401, 404, 503, 507)}}},
    "/healthz": {"get": {"summary": "The gateway process is up", "security": [], "responses": {
        "200": {"description": "up", "content": _json({"type": "object", "required": ["ok"]})}}}},
    "/readyz": {"get": {"summary": "Ready to serve (every role is up, not draining)", "security": [], "responses": {
        "200": {"description": "ready", "content": _json({"type": "object", "required": ["ready"]})},
        **_errors(503)}}},
    "/metrics": {"get": {"summary": "Prometheus metrics of the whole process tree", "security": [], "responses": {
        "200": {"description": "text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
    "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {
        "200": {"description": "OpenAPI 3.1", "content": _json({"type": "object"})}}}},
}


def document(title: str = "Agent OS", version: str = "0.1.0") -> dict[str, Any]:
    return {"openapi": "3.1.0",
            "info": {"title": title, "version": version,
                     "description": "Durable, multi-tenant agent sessions and flows. Errors are "
                                    "{\"error\": {\"code\", \"message\"}}."},
            "servers": [{"url": "/"}],
            "components": {"schemas": SCHEMAS,
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                          "description": "API key (auth.api_keys); none when "
                                                                         "no keys are configured"}}},
            "security": [{"bearer": []}, {}],
            "paths": PATHS}
