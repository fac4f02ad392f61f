"""An in-process stand-in for skein's application master KV service, at the gRPC boundary only.

Why here: there is no YARN in CI. The real ``skein.kv.KeyValueStore`` (operations, transactions, the watch stream
and its handler thread) runs unmodified on top of this; only ``ApplicationClient._call(rpc, request)`` — the network
hop to the Java AM — is replaced, answering with skein's real protobuf messages the way the AM does
(GetRange/DeleteRange/PutKey/Transaction/Watch; owned keys are deleted when their container exits).
"""
from __future__ import annotations

import queue
import threading

import grpc

from skein.kv import KeyValueStore
from skein.proto import skein_pb2 as pb


class _StreamBroken(grpc.RpcError):
    """How grpc ends a stream whose connection the server sent a GOAWAY on."""

    def code(self):
        return grpc.StatusCode.INTERNAL

    def details(self):
        return "Received RST_STREAM with error code 2: Stream 19 sent too many headers"


def _cid(owner) -> str:
    return f"{owner.service_name}_{owner.instance}"


class FakeAM:
    def __init__(self):
        self.data: dict[str, tuple[bytes, object | None]] = {}
        self.lock = threading.RLock()
        self.watches: dict[int, tuple[str, str, str, queue.Queue]] = {}
        self.next_watch = 1
        self.down = False
        #: keys whose next put stores the value, sends no watch event and fails (skein 0.8.2's AM race, see kv_yarn)
        self.fail_puts: set[str] = set()
        #: the watch stream dies at its next create request, unanswered (the AM's HTTP/2 GOAWAY "sent too many
        #: headers" seen under load): skein's subscribe then waits forever
        self.break_watch = False
        self.kv = KeyValueStore(self)

    # -- helpers -------------------------------------------------------------------------------------------------
    def _range(self, start: str, end: str) -> list[str]:
        return sorted(k for k in self.data if k >= start and (not end or k < end))

    def _kv(self, key: str) -> pb.KeyValue:
        value, owner = self.data[key]
        kv = pb.KeyValue(key=key, value=value)
        if owner is not None:
            kv.owner.CopyFrom(owner)
        return kv

    def _notify(self, key: str, kind: str, kv: pb.KeyValue | None) -> None:
        for wid, (start, end, etype, q) in list(self.watches.items()):
            if key >= start and (not end or key < end) and etype in ("ALL", kind):
                resp = pb.WatchResponse(type=kind, watch_id=wid)
                resp.event.append(kv if kv is not None else pb.KeyValue(key=key))
                q.put(resp)

    def _get_range(self, req):
        keys = self._range(req.start, req.end)
        resp = pb.GetRangeResponse(count=len(keys), result_type=req.result_type)
        if req.result_type != pb.GetRangeRequest.NONE:
            resp.result.extend(self._kv(k) for k in keys)
        return resp

    def _delete_range(self, req):
        keys = self._range(req.start, req.end)
        resp = pb.DeleteRangeResponse(count=len(keys), result_type=req.result_type)
        for k in keys:
            if req.result_type != pb.DeleteRangeRequest.NONE:
                resp.result.append(self._kv(k))
            del self.data[k]
            self._notify(k, "DELETE", None)
        return resp

    def _put_key(self, req):
        prev = self.data.get(req.key)
        if prev is None and req.ignore_value:
            raise KeyError(req.key)
        value = prev[0] if req.ignore_value else req.value
        owner = (prev[1] if prev else None) if req.ignore_owner else (req.owner if req.HasField("owner") else None)
        resp = pb.PutKeyResponse(return_previous=req.return_previous)
        if req.return_previous and prev is not None:
            resp.previous.CopyFrom(self._kv(req.key))
        self.data[req.key] = (value, owner)
        if req.key in self.fail_puts:
            self.fail_puts.discard(req.key)
            from skein.exceptions import ApplicationError
            raise ApplicationError("")
        self._notify(req.key, "PUT", self._kv(req.key))
        return resp

    def _condition(self, c) -> bool:
        cur = self.data.get(c.key)
        if c.field == pb.Condition.VALUE:
            have, want = (cur[0] if cur else None), (c.value if c.HasField("value") else None)
        else:
            have = _cid(cur[1]) if cur and cur[1] is not None else None
            want = _cid(c.owner) if c.HasField("owner") else None
        if c.operator == pb.Condition.EQUAL:
            return have == want
        if c.operator == pb.Condition.NOT_EQUAL:
            return have != want
        raise NotImplementedError(c.operator)

    def _op(self, op):
        which = op.WhichOneof("request")
        fn = {"get_range": self._get_range, "put_key": self._put_key, "delete_range": self._delete_range}[which]
        return pb.OpResponse(**{which: fn(getattr(op, which))})

    # -- the gRPC boundary skein calls ----------------------------------------------------------------------------
    def _call(self, method, req, timeout=None):
        if self.down:
            from skein.exceptions import ConnectionError
            raise ConnectionError("Unable to connect to application")
        with self.lock:
            if method == "GetRange":
                return self._get_range(req)
            if method == "DeleteRange":
                return self._delete_range(req)
            if method == "PutKey":
                return self._put_key(req)
            if method == "Transaction":
                ok = all(self._condition(c) for c in req.condition)
                ops = req.on_success if ok else req.on_failure
                return pb.TransactionResponse(succeeded=ok, result=[self._op(o) for o in ops])
            if method == "Watch":
                return self._watch_stream(req)
        raise NotImplementedError(method)

    def _watch_stream(self, requests):
        out: queue.Queue = queue.Queue()

        def pump():
            for r in requests:
                with self.lock:
                    if r.WhichOneof("request") == "create" and self.break_watch:
                        out.put(_StreamBroken())
                    elif r.WhichOneof("request") == "create":
                        wid = self.next_watch
                        self.next_watch += 1
                        self.watches[wid] = (r.create.start, r.create.end,
                                             pb.WatchCreateRequest.Type.Name(r.create.event_type), out)
                        out.put(pb.WatchResponse(type="CREATE", watch_id=wid))
                    else:
                        self.watches.pop(r.cancel.watch_id, None)
                        out.put(pb.WatchResponse(type="CANCEL", watch_id=r.cancel.watch_id))

        threading.Thread(target=pump, daemon=True).start()

        class _Stream:
            def __iter__(self):
                return self

            def __next__(self):
                item = out.get()
                if isinstance(item, Exception):
                    raise item
                return item

        return _Stream()

    # -- what the AM does when a container exits ------------------------------------------------------------------
    def container_exited(self, container_id: str) -> None:
        with self.lock:
            for k in [k for k, (_, o) in self.data.items() if o is not None and _cid(o) == container_id]:
                del self.data[k]
                self._notify(k, "DELETE", None)
