"""The schemas of the API's bodies (`components/schemas` of gateway/openapi.py's document), and
the id patterns its paths share."""
from __future__ import annotations

from typing import Any

from broker.protocol import MAX_WHERE, RUN_STATUSES

ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,127}$"}
NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,199}$"}
ANY: dict = {}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "ErrorBody": {"type": "object", "required": ["code", "message"],
                  "properties": {"code": {"type": "string"}, "message": {"type": "string"}}},
    "Error": {"type": "object", "required": ["error"], "properties": {"error": ref("ErrorBody")}},
    "TurnInput": {"type": "object", "required": ["input"],
                  "properties": {"input": {"type": "string", "minLength": 1, "maxLength": 200000},
                                 "system": {"type": "string", "maxLength": 200000,
                                            "description": "this turn's instructions, in place of the "
                                                           "server's provider.system_prompt"}}},
    "Cancelled": {"type": "object", "required": ["cancelled", "turn_id"],
                  "properties": {"cancelled": {"const": True}, "turn_id": {"type": "string"}}},
    "Sessions": {"type": "object", "required": ["sessions"],
                 "properties": {"next_after": {"type": ["string", "null"]}, "next_before": {"type": ["string", "null"]},
                                "sessions": {"type": "array", "items": {
                                    "type": "object", "required": ["session_id", "messages", "first_at", "last_at"],
                                    "properties": {"session_id": {"type": "string"}, "messages": {"type": "integer"},
                                                   "first_at": {"type": "number"}, "last_at": {"type": "number"}}}}}},
    "SessionState": {"type": "object", "required": ["session_id", "messages", "first_at", "last_at", "active_turn"],
                "properties": {"session_id": {"type": "string"}, "messages": {"type": "integer"},
                               "first_at": {"type": ["number", "null"]}, "last_at": {"type": ["number", "null"]},
                               "active_turn": {"type": ["object", "null"], "required": ["turn_id", "resumed"],
                                               "properties": {"turn_id": {"type": "string"},
                                                              "resumed": {"type": "boolean"},
                                                              "approvals": {"type": "array",
                                                                            "items": ref("Approval")}}}}},
    "Approval": {"type": "object", "required": ["call_id", "name", "arguments", "until"],
                 "description": "a tool call waiting for a person's answer (kernel.approve_tools)",
                 "properties": {"call_id": {"type": "string"}, "name": {"type": "string"},
                                "arguments": {"type": "string"}, "until": {"type": "number"}}},
    "ApprovalAnswer": {"type": "object", "required": ["approve"],
                       "properties": {"approve": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 2000}}},
    "Messages": {"type": "object", "required": ["session_id", "messages"],
                 "properties": {"session_id": {"type": "string"}, "next_after": {"type": ["integer", "null"]},
                                "next_before": {"type": ["integer", "null"]},
                                "messages": {"type": "array", "items": {"type": "object", "required": ["index", "role"],
                                                                        "properties": {"index": {"type": "integer"},
                                                                                       "role": {"type": "string"}}}}}},
    "Events": {"type": "object", "required": ["session_id", "events"],
               "properties": {"session_id": {"type": "string"}, "next_after": {"type": ["integer", "null"]},
                              "next_before": {"type": ["integer", "null"]},
                              "events": {"type": "array", "items": {"type": "object", "required": ["type", "turn_id"],
                                                                    "properties": {"type": {"type": "string"}}}}}},
    "CheckpointSaved": {"type": "object", "required": ["session_id", "key", "seq", "durability"],
                        "properties": {"session_id": {"type": "string"}, "key": {"type": "string"},
                                       "seq": {"type": "integer"}, "durability": {"enum": ["none", "local", "s3"]}}},
    "SessionFork": {"type": "object", "properties": {"session_id": ID, "messages": {
        "type": "integer", "minimum": 1, "maximum": 2 ** 31 - 1,
        "description": "how many of the session's first messages the fork begins with"}}},
    "SessionForked": {"type": "object", "required": ["session_id", "forked_from", "messages"],
                      "properties": {"session_id": {"type": "string"}, "forked_from": {"type": "string"},
                                     "messages": {"type": "integer"}}},
    "RunStart": {"type": "object", "properties": {
        "input": ANY, "run_id": NAME,
        "start_at": {"description": "a delayed start: the run exists at once (status scheduled) and runs from this "
                                    "time on; epoch seconds or an ISO 8601 time with its offset",
                     "oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}]},
        "delay_secs": {"type": "number", "minimum": 0, "maximum": 366 * 86400,
                       "description": "a delayed start, this many seconds from now (not with start_at)"},
        "timeout_secs": {"type": "number", "exclusiveMinimum": 0, "maximum": 366 * 86400,
                         "description": "the run is cancelled (with its children) if it has not ended this long "
                                        "after it began (a queued run: after its admission)"},
        "queue": {"type": "string", "description": "a flow queue of the server (kernel.flow_queues): the run is "
                                                   "enqueued until the queue has a place for it"},
        "priority": {"type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1,
                     "description": "with a queue: admitted before the runs waiting there with higher numbers "
                                    "(default 0, first)"},
        "queue_key": {"type": "string", "minLength": 1, "maxLength": 200,
                      "description": "in a queue per key (and only there): the key whose limit the run keeps to"}}},
    "Run": {"type": "object", "required": ["run_id", "status"],
            "properties": {"run_id": {"type": "string"}, "status": {"type": "string"}, "flow": {"type": "string"},
                           "created": {"type": "boolean"}, "result": ANY, "error": {"type": "string"},
                           "started_at": {"type": "number"}, "ended_at": {"type": ["number", "null"]},
                           "parent": {"type": "string"}, "forked_from": {"type": "string"},
                           "fork_seq": {"type": "integer"}, "start_at": {"type": "number"},
                           "schedule": {"type": "string"}, "scheduled_at": {"type": "number"},
                           "timeout_at": {"type": "number"}, "queue": {"type": "string"},
                           "admitted_at": {"type": "number", "description": "when the run got its queue's place"},
                           "priority": {"type": "integer"}, "queue_key": {"type": "string"},
                           "waiting_on": {"type": "object", "required": ["op", "seq", "since"],
                                          "description": "what a suspended run waits for",
                                          "properties": {"op": {"enum": ["sleep", "wait", "child"]},
                                                         "seq": {"type": "integer"}, "since": {"type": "number"},
                                                         "due": {"type": "number"},
                                                         "channels": {"type": "array", "items": {"type": "string"}},
                                                         "children": {"type": "array",
                                                                      "items": {"type": "string"}}}}}},
    "ScheduleDefinition": {"type": "object", "required": ["flow", "cron"], "properties": {
        "flow": NAME, "cron": {"type": "string", "description": "5 fields (minute hour day month weekday), or 6 "
                                                                "with seconds first; or @daily, @hourly, ..."},
        "input": ANY, "timezone": {"type": "string", "description": "the cron's time zone (default UTC)"},
        "catchup_secs": {"type": "number", "minimum": 0, "maximum": 7 * 86400,
                         "description": "a time missed while the server was down is started when it is back if "
                                        "it is at most this old (default 60)"},
        "queue": {"type": "string", "description": "a flow queue (kernel.flow_queues) its runs wait in: with "
                                                   "one place, they never overlap"}}},
    "Schedule": {"type": "object", "required": ["name", "flow", "cron", "timezone", "catchup_secs", "next_at"],
                 "properties": {"name": {"type": "string"}, "flow": {"type": "string"}, "cron": {"type": "string"},
                                "timezone": {"type": "string"}, "input": ANY, "catchup_secs": {"type": "number"},
                                "created_at": {"type": "number"}, "updated_at": {"type": "number"},
                                "next_at": {"type": ["number", "null"]}, "queue": {"type": ["string", "null"]}}},
    "Schedules": {"type": "object", "required": ["schedules", "next_after"],
                  "properties": {"schedules": {"type": "array", "items": ref("Schedule")},
                                 "next_after": {"type": ["string", "null"]}}},
    "Fork": {"type": "object", "properties": {"from_seq": {"type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1},
                                              "run_id": NAME,
                                              "queue": {"type": "string", "description": "a flow queue the fork "
                                                        "waits in (default: the original's, if it had one)"}}},
    "Runs": {"type": "object", "required": ["runs"],
             "properties": {"next_after": {"type": ["string", "null"]}, "next_before": {"type": ["string", "null"]},
                            "runs": {"type": "array", "items": {
                                "type": "object", "required": ["run_id", "flow", "status", "started_at", "ended_at"],
                                "properties": {"run_id": {"type": "string"}, "flow": {"type": ["string", "null"]},
                                               "status": {"enum": [s for s in RUN_STATUSES if s != "open"]},
                                               "started_at": {"type": ["number", "null"]},
                                               "start_at": {"type": "number"}, "priority": {"type": "integer"},
                                               "ended_at": {"type": ["number", "null"]},
                                               "parent": {"type": "string"}, "queue": {"type": "string"},
                                               "queue_key": {"type": "string"},
                                               "schedule": {"type": "string"},
                                               "forked_from": {"type": "string"}}}}}},
    "Steps": {"type": "object", "required": ["run_id", "steps", "next_after"],
              "properties": {"run_id": {"type": "string"}, "next_after": {"type": ["integer", "null"]},
                             "steps": {"type": "array", "items": {
                                 "type": "object", "required": ["seq", "op", "name", "status", "started_at", "ended_at"],
                                 "properties": {"seq": {"type": "integer"},
                                                "op": {"type": "string", "description": "step, sleep, wait, "
                                                                                        "child, attr_set or patch "
                                                                                        "(a ctx.patched mark)"},
                                                "name": {"type": "string"},
                                                "status": {"enum": ["completed", "failed", "running", "waiting",
                                                                    "abandoned"]},
                                                "attempts": {"type": "integer"},
                                                "interrupted": {"type": "integer", "description": "attempts "
                                                                "cut short by their worker's clean stop (not "
                                                                "counted against the step's retries)"},
                                                "started_at": {"type": "number"},
                                                "ended_at": {"type": ["number", "null"]}, "result": ANY,
                                                "error": {"type": "string"}, "child": {"type": "string"},
                                                "channel": {"type": "string"}, "due": {"type": "number"},
                                                "channels": {"type": "array", "items": {"type": "string"},
                                                             "description": "a wait for any of these "
                                                                            "(ctx.wait_any); its result is "
                                                                            "[channel, message]"},
                                                "heartbeat": ANY}}}}},
    "Attributes": {"type": "object", "required": ["run_id", "attributes"],
                   "properties": {"run_id": {"type": "string"}, "attributes": {"type": "object"}}},
    "Update": {"type": "object", "required": ["handler"], "properties": {"handler": NAME, "arg": ANY},
               "additionalProperties": False},
    "Updated": {"type": "object", "required": ["run_id", "key", "value"],
                "properties": {"run_id": {"type": "string"}, "key": {"type": "string"}, "value": ANY}},
    "Publish": {"type": "object", "properties": {"message": ANY}, "additionalProperties": False},
    "Published": {"type": "object", "required": ["run_id", "channel", "published"],
                  "properties": {"run_id": {"type": "string"}, "channel": {"type": "string"},
                                 "published": {"const": True}}},
    "Broadcast": {"type": "object", "additionalProperties": False, "properties": {
        "message": ANY, "flow": NAME,
        "where": {"type": "object", "minProperties": 1, "maxProperties": MAX_WHERE, "additionalProperties": ANY,
                  "description": "attributes a run must have, each with this value"}}},
    "Broadcasted": {"type": "object", "required": ["channel", "delivered"],
                    "properties": {"channel": {"type": "string"}, "delivered": {"type": "integer", "minimum": 0}}},
    "Emitted": {"type": "object", "required": ["run_id", "emitted", "next_after", "status"], "properties": {
        "run_id": {"type": "string"}, "status": {"type": "string"},
        "next_after": {"type": ["integer", "null"], "description": "more are there now: ask after this seq"},
        "emitted": {"type": "array", "items": {"type": "object", "required": ["seq", "value", "at"], "properties": {
            "seq": {"type": "integer"}, "value": ANY, "at": {"type": ["number", "null"]}}}}}},
    "ChannelWaiters": {"type": "object", "required": ["channel", "count", "runs"], "properties": {
        "channel": {"type": "string"}, "count": {"type": "integer", "minimum": 0},
        "runs": {"type": "array", "items": {"type": "object", "required": ["run_id", "flow", "since"], "properties": {
            "run_id": {"type": "string"}, "flow": {"type": "string"}, "since": {"type": "number"}}}}}},
    "Session": {"type": "object", "required": ["session_id"], "properties": {"session_id": {"type": "string"}}},
}
