#!/usr/bin/env python3
"""confluent-kafka driver for weir's security tests (tests/tests/security_*.rs).

Usage: kafka_client.py ACTION CONFIG_JSON [ARGS...]
CONFIG_JSON holds the librdkafka settings (bootstrap.servers, security.protocol, ssl.*,
sasl.*). Every wait is bounded; the last line printed is `OK ...` or `FAIL ...`, and the
exit status is 0 only for OK.

Actions:
  roundtrip TOPIC N       create TOPIC, produce N keyed records with an idempotent
                          producer, consume them all back in a consumer group, commit,
                          and check the committed offset
  scram-add USER PASSWORD MECHANISM
                          AlterUserScramCredentials upsert (MECHANISM SCRAM-SHA-256/512)
  scram-delete USER MECHANISM
                          AlterUserScramCredentials deletion
  scram-describe USER     DescribeUserScramCredentials: prints the mechanisms
  metadata                prints `OK host:port` of the broker Metadata advertises
  expect-auth-fail        Metadata must fail with an authentication error
  tls-apiversions         CONFIG_JSON is {"host","port","ca","cert","key"} (cert/key
                          optional): a TLS connection sends ApiVersions; prints
                          `OK answered` or `OK refused REASON`
  tls-pieces              CONFIG_JSON like tls-apiversions: the TLS bytes both ways go
                          through a relay in 1..7-byte pieces; handshake, ApiVersions
                          and Metadata must complete
  acl-setup TOPIC USER    (as a super user) create TOPIC; CreateAcls: USER may Read and
                          Write TOPIC and Read groups prefixed `g-`; DescribeAcls of
                          USER: prints `OK N acls`
  produce-consume TOPIC N produce N records (idempotent, acks=all) to the existing TOPIC
                          and consume them back in a `g-` group, committing
  expect-denied TOPIC     a produce to TOPIC fails with TOPIC_AUTHORIZATION_FAILED and a
                          consumer subscribed to TOPIC (in a `g-` group) gets it too
  acl-group USER          CreateAcls: USER may Read groups prefixed `g-`
  acl-delete USER         DeleteAcls of USER's ACLs (MATCH any resource): prints `OK N`
  bench-produce TOPIC MIB produce MIB MiB in 1 KiB records (acks=1, no compression);
                          prints `OK produce_mibs=..`
  bench-consume TOPIC MIB consume them back from offset 0; prints `OK consume_mibs=..`
  reauth-produce TOPIC SECONDS
                          create TOPIC; for SECONDS an idempotent producer (acks=all)
                          sends records, one per turn of a loop that also polls a group
                          consumer (up to 50 ms); no client error may occur (a broker that closes the
                          connections at the session lifetime shows as disconnects) and
                          every record must be consumed: prints `OK N records`
  reauth-revoked TOPIC USER MECHANISM ADMIN_JSON
                          a producer logged in as USER produces to TOPIC, then USER's
                          SCRAM credential is deleted (through ADMIN_JSON's settings); the
                          producer must then report an authentication error (its
                          re-authentication failed) within 30 s
  scram-auth              CONFIG_JSON is {"host","port","user","password","mechanism"}:
                          one plaintext connection runs SaslHandshake v1 and the SCRAM
                          exchange (SaslAuthenticate v0), client side written from RFC
                          5802 here; prints `OK authenticated` (server signature checked)
"""

import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

TIMEOUT_S = 60


def fail(msg):
    print(f"FAIL {msg}", flush=True)
    sys.exit(1)


def create_topic(conf, topic, partitions=2):
    admin = AdminClient(conf)
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for f in fs.values():
        f.result(timeout=TIMEOUT_S)


def roundtrip(conf, topic, n):
    create_topic(conf, topic)
    errors = []
    p = Producer({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(),
                  on_delivery=lambda e, m: errors.append(e) if e else None)
        p.poll(0)
    left = p.flush(TIMEOUT_S)
    if left or errors:
        fail(f"produce: {left} unflushed, errors {errors[:3]}")
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    seen = set()
    deadline = time.time() + TIMEOUT_S
    while len(seen) < n and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            fail(f"consume: {m.error()}")
        seen.add(m.value().decode())
    if len(seen) != n:
        fail(f"consumed {len(seen)} of {n}")
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=TIMEOUT_S)
    total = sum(max(tp.offset, 0) for tp in committed)
    c.close()
    if total != n:
        fail(f"committed offsets sum to {total}, expected {n}")
    print(f"OK {n} records via group {group}", flush=True)


def scram_add(conf, user, password, mechanism):
    mech = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
            "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}[mechanism]
    admin = AdminClient(conf)
    up = UserScramCredentialUpsertion(user, ScramCredentialInfo(mech, 8192), password.encode())
    for f in admin.alter_user_scram_credentials([up]).values():
        f.result(timeout=TIMEOUT_S)
    print(f"OK {user} {mechanism}", flush=True)


def scram_delete(conf, user, mechanism):
    mech = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
            "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}[mechanism]
    admin = AdminClient(conf)
    for f in admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, mech)]).values():
        f.result(timeout=TIMEOUT_S)
    print(f"OK deleted {user} {mechanism}", flush=True)


def scram_describe(conf, user):
    admin = AdminClient(conf)
    fut = admin.describe_user_scram_credentials([user])
    desc = fut[user].result(timeout=TIMEOUT_S)
    mechs = sorted(str(i.mechanism) for i in desc.scram_credential_infos)
    print(f"OK {' '.join(mechs)}", flush=True)


def metadata(conf):
    admin = AdminClient(conf)
    md = admin.list_topics(timeout=TIMEOUT_S)
    b = next(iter(md.brokers.values()))
    print(f"OK {b.host}:{b.port}", flush=True)


def expect_auth_fail(conf):
    errors = []
    p = Producer({**conf, "error_cb": errors.append})
    deadline = time.time() + 30
    auth = []
    while not auth and time.time() < deadline:
        p.poll(0.5)
        auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if not auth:
        fail(f"no authentication error, got {errors[:3]}")
    try:
        p.list_topics(timeout=5)
        fail("Metadata was served without authentication")
    except KafkaException:
        pass
    print(f"OK {auth[0]}", flush=True)


def tls_apiversions(conf):
    import socket
    import ssl
    import struct
    ctx = ssl.create_default_context(cafile=conf["ca"])
    if conf.get("cert"):
        ctx.load_cert_chain(conf["cert"], conf["key"])
    # ApiVersions v0: api key 18, version 0, correlation id 1, client id "probe".
    header = struct.pack(">hhih", 18, 0, 1, 5) + b"probe"
    frame = struct.pack(">i", len(header)) + header
    try:
        raw = socket.create_connection((conf["host"], conf["port"]), timeout=20)
        s = ctx.wrap_socket(raw, server_hostname="localhost")
        s.sendall(frame)
        data = s.recv(4)
    except (ssl.SSLError, OSError) as e:
        print(f"OK refused {e}", flush=True)
        return
    if len(data) == 4:
        print("OK answered", flush=True)
    else:
        print(f"OK refused connection closed ({data!r})", flush=True)


def tls_pieces(conf):
    """TLS records arriving in pieces: a local relay forwards the client's bytes to the
    broker 1..7 bytes at a time (and the broker's back the same way); the handshake,
    ApiVersions and Metadata must still complete."""
    import random
    import socket
    import ssl
    import struct
    import threading
    rng = random.Random(20261201)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def pump(src, dst):
        try:
            while True:
                data = src.recv(4096)
                if not data:
                    break
                i = 0
                while i < len(data):
                    n = rng.randint(1, 7)
                    dst.sendall(data[i:i + n])
                    i += n
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def relay():
        client, _ = lsock.accept()
        upstream = socket.create_connection((conf["host"], conf["port"]), timeout=30)
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        pump(upstream, client)

    threading.Thread(target=relay, daemon=True).start()
    ctx = ssl.create_default_context(cafile=conf["ca"])
    raw = socket.create_connection(lsock.getsockname(), timeout=30)
    s = ctx.wrap_socket(raw, server_hostname="localhost")

    def call(api_key, version, body, cid):
        header = struct.pack(">hhih", api_key, version, cid, 5) + b"probe"
        s.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        size = struct.unpack(">i", recv_exact(4))[0]
        resp = recv_exact(size)
        if struct.unpack(">i", resp[:4])[0] != cid:
            fail("correlation id mismatch")
        return resp

    def recv_exact(n):
        out = b""
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                fail(f"connection closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    call(18, 0, b"", 1)
    # Metadata v1, all topics (null array).
    md = call(3, 1, struct.pack(">i", -1), 2)
    print(f"OK handshake, ApiVersions and Metadata ({len(md)} bytes) in pieces", flush=True)


def acl_setup(conf, topic, user):
    create_topic(conf, topic)
    admin = AdminClient(conf)
    principal = f"User:{user}"
    lit, pre, allow = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED, AclPermissionType.ALLOW
    bindings = [
        AclBinding(ResourceType.TOPIC, topic, lit, principal, "*", AclOperation.READ, allow),
        AclBinding(ResourceType.TOPIC, topic, lit, principal, "*", AclOperation.WRITE, allow),
        AclBinding(ResourceType.GROUP, "g-", pre, principal, "*", AclOperation.READ, allow),
    ]
    for f in admin.create_acls(bindings).values():
        f.result(timeout=TIMEOUT_S)
    mine = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                            AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(mine).result(timeout=TIMEOUT_S)
    if len(found) != 3:
        fail(f"described {found}")
    print(f"OK {len(found)} acls", flush=True)


def produce_consume(conf, topic, n):
    errors = []
    p = Producer({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(),
                  on_delivery=lambda e, m: errors.append(e) if e else None)
        p.poll(0)
    if p.flush(TIMEOUT_S) or errors:
        fail(f"produce: errors {errors[:3]}")
    c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.time() + TIMEOUT_S
    while got < n and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            fail(f"consume: {m.error()}")
        got += 1
    if got != n:
        fail(f"consumed {got} of {n}")
    c.commit(asynchronous=False)
    c.close()
    print(f"OK {n} records", flush=True)


def expect_denied(conf, topic):
    errors = []
    p = Producer({**conf, "acks": "all", "message.timeout.ms": 30000})
    p.produce(topic, value=b"x", on_delivery=lambda e, m: errors.append(e) if e else None)
    p.flush(TIMEOUT_S)
    if not errors or errors[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
        fail(f"produce: expected TOPIC_AUTHORIZATION_FAILED, got {errors[:3]}")
    c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    # Subscribed in a group the principal may use: the refusal is the topic's.
    c.subscribe([topic])
    seen, other = None, []
    deadline = time.time() + TIMEOUT_S
    while seen is None and time.time() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if not m.error():
            fail("a record was consumed")
        if m.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            seen = m.error()
        else:
            other.append(m.error())
    c.close()
    if seen is None:
        fail(f"consume: expected TOPIC_AUTHORIZATION_FAILED, got {other[:3]}")
    print(f"OK produce and consume refused: {errors[0].name()}", flush=True)


def acl_group(conf, user):
    admin = AdminClient(conf)
    b = AclBinding(ResourceType.GROUP, "g-", ResourcePatternType.PREFIXED, f"User:{user}", "*",
                   AclOperation.READ, AclPermissionType.ALLOW)
    for f in admin.create_acls([b]).values():
        f.result(timeout=TIMEOUT_S)
    print("OK", flush=True)


def acl_delete(conf, user):
    admin = AdminClient(conf)
    f = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}", None,
                         AclOperation.ANY, AclPermissionType.ANY)
    deleted = [b for fut in admin.delete_acls([f]).values() for b in fut.result(timeout=TIMEOUT_S)]
    print(f"OK {len(deleted)}", flush=True)


def bench_produce(conf, topic, mib):
    create_topic(conf, topic, partitions=1)
    value = b"x" * 1024
    n = mib * 1024
    p = Producer({**conf, "linger.ms": 5, "batch.size": 1 << 20, "acks": 1,
                  "compression.type": "none", "queue.buffering.max.kbytes": 1 << 20})
    start = time.time()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(TIMEOUT_S * 5):
        fail("produce did not finish")
    print(f"OK produce_mibs={mib / (time.time() - start):.1f}", flush=True)


def bench_consume(conf, topic, mib):
    n = mib * 1024
    c = Consumer({**conf, "group.id": f"b-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.time()
    deadline = start + TIMEOUT_S * 5
    while got < n and time.time() < deadline:
        for m in c.consume(10000, 1.0):
            if m.error():
                fail(f"consume: {m.error()}")
            got += 1
    took = time.time() - start
    c.close()
    if got < n:
        fail(f"consumed {got} of {n}")
    print(f"OK consume_mibs={mib / took:.1f}", flush=True)


def scram_auth(conf):
    import base64, hashlib, hmac, os, socket, struct
    digest = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}[conf["mechanism"]]
    sock = socket.create_connection((conf["host"], int(conf["port"])), timeout=TIMEOUT_S)
    corr = [0]

    def recv_exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                fail("connection closed by the broker")
            buf += chunk
        return buf

    def call(api_key, version, body):
        corr[0] += 1
        cid = b"scram-auth"
        head = struct.pack(">hhih", api_key, version, corr[0], len(cid)) + cid
        msg = head + body
        sock.sendall(struct.pack(">i", len(msg)) + msg)
        size = struct.unpack(">i", recv_exact(4))[0]
        resp = recv_exact(size)
        return resp[4:]

    mech = conf["mechanism"].encode()
    resp = call(17, 1, struct.pack(">h", len(mech)) + mech)
    if struct.unpack(">h", resp[:2])[0] != 0:
        fail(f"SaslHandshake error {struct.unpack('>h', resp[:2])[0]}")

    def authenticate(token):
        resp = call(36, 0, struct.pack(">i", len(token)) + token)
        code = struct.unpack(">h", resp[:2])[0]
        mlen = struct.unpack(">h", resp[2:4])[0]
        rest = resp[4 + max(mlen, 0):]
        if code != 0:
            fail(f"SaslAuthenticate error {code}: {resp[4:4 + max(mlen, 0)].decode()}")
        blen = struct.unpack(">i", rest[:4])[0]
        return rest[4:4 + blen]

    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={conf['user']},r={nonce}"
    server_first = authenticate(f"n,,{bare}".encode()).decode()
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    if not attrs["r"].startswith(nonce):
        fail("server nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(digest().name, conf["password"].encode(),
                                 base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored_key = digest(client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{bare},{server_first},{without_proof}".encode()
    sig = hmac.new(stored_key, auth, digest).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, sig))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    server_final = authenticate(final).decode()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    want = "v=" + base64.b64encode(hmac.new(server_key, auth, digest).digest()).decode()
    if server_final != want:
        fail("the server's signature is wrong")
    print("OK authenticated", flush=True)


def reauth_produce(conf, topic, seconds):
    create_topic(conf, topic, partitions=1)
    errors = []
    failed = []
    p = Producer({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "error_cb": errors.append})
    c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "error_cb": errors.append})
    c.subscribe([topic])
    seen = set()
    sent = 0
    end = time.time() + seconds
    while time.time() < end:
        p.produce(topic, value=f"r{sent}".encode(),
                  on_delivery=lambda e, m: failed.append(e) if e else None)
        sent += 1
        p.poll(0)
        m = c.poll(0.05)
        if m is not None and not m.error():
            seen.add(m.value().decode())
        if errors or failed:
            fail(f"client errors during the session lifetimes: {errors[:3]} {failed[:3]}")
    left = p.flush(TIMEOUT_S)
    if left or failed:
        fail(f"produce: {left} unflushed, errors {failed[:3]}")
    deadline = time.time() + TIMEOUT_S
    while len(seen) < sent and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            seen.add(m.value().decode())
    c.close()
    if errors:
        fail(f"client errors: {errors[:3]}")
    if len(seen) != sent:
        fail(f"consumed {len(seen)} of {sent}")
    print(f"OK {sent} records", flush=True)


def reauth_revoked(conf, topic, user, mechanism, admin_conf):
    create_topic(admin_conf, topic, partitions=1)
    errors = []
    p = Producer({**conf, "acks": "all", "error_cb": errors.append})
    p.produce(topic, value=b"before")
    if p.flush(TIMEOUT_S):
        fail("the first record was not delivered")
    if errors:
        fail(f"errors before the deletion: {errors[:3]}")
    scram_delete(admin_conf, user, mechanism)
    deadline = time.time() + 30
    auth = []
    while not auth and time.time() < deadline:
        p.produce(topic, value=b"after")
        p.poll(0.1)
        auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if not auth:
        fail(f"no authentication error after the deletion, got {errors[:3]}")
    print(f"OK {auth[0]}", flush=True)


def main():
    action, conf = sys.argv[1], json.loads(sys.argv[2])
    args = sys.argv[3:]
    try:
        if action == "roundtrip":
            roundtrip(conf, args[0], int(args[1]))
        elif action == "scram-add":
            scram_add(conf, args[0], args[1], args[2])
        elif action == "scram-delete":
            scram_delete(conf, args[0], args[1])
        elif action == "scram-describe":
            scram_describe(conf, args[0])
        elif action == "metadata":
            metadata(conf)
        elif action == "expect-auth-fail":
            expect_auth_fail(conf)
        elif action == "tls-apiversions":
            tls_apiversions(conf)
        elif action == "tls-pieces":
            tls_pieces(conf)
        elif action == "acl-setup":
            acl_setup(conf, args[0], args[1])
        elif action == "produce-consume":
            produce_consume(conf, args[0], int(args[1]))
        elif action == "expect-denied":
            expect_denied(conf, args[0])
        elif action == "acl-group":
            acl_group(conf, args[0])
        elif action == "acl-delete":
            acl_delete(conf, args[0])
        elif action == "bench-produce":
            bench_produce(conf, args[0], int(args[1]))
        elif action == "reauth-produce":
            reauth_produce(conf, args[0], float(args[1]))
        elif action == "reauth-revoked":
            reauth_revoked(conf, args[0], args[1], args[2], json.loads(args[3]))
        elif action == "scram-auth":
            scram_auth(conf)
        elif action == "bench-consume":
            bench_consume(conf, args[0], int(args[1]))
        else:
            fail(f"unknown action {action}")
    except KafkaException as e:
        fail(f"{action}: {e}")


if __name__ == "__main__":
    main()
