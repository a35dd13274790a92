// The official MCP TypeScript SDK's client (@modelcontextprotocol/sdk)
// driving tai42's MCP server, over both transports: "tai42 mcp" over stdio
// (on a daemon, through TAI42_URL) and the daemon's /mcp over Streamable
// HTTP. The daemon is a real "tai42 serve" this test starts and stops by
// PID: the container provider as root with runc or crun (CI), else the host
// provider. $TAI42_BIN is the binary (test.sh builds it).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv";

const bin = process.env.TAI42_BIN;
assert.ok(bin, "set TAI42_BIN to a tai42 binary");

const TOOLS = ["close_process_stdin", "create_session", "destroy_session", "kill_process", "list_dir",
  "list_processes", "list_sessions", "read_file", "read_process_output", "run", "start_process", "touch",
  "write_file", "write_process_stdin"];

function provider() {
  if (process.getuid() !== 0) return "host";
  const path = (process.env.PATH || "").split(":");
  return ["runc", "crun"].some((rt) => path.some((d) => existsSync(join(d, rt)))) ? "container" : "host";
}

// daemon: one "tai42 serve" on loopback, its policy capping the network
// at internal (so that egress is a rejected spec).
const daemon = { dir: "", proc: null, url: "", token: randomBytes(32).toString("hex"), log: "", provider: provider() };

before(async () => {
  console.log(`# tai42 serve --provider ${daemon.provider}`);
  daemon.dir = mkdtempSync(join(tmpdir(), "t42node-"));
  daemon.proc = spawn(bin, ["serve", "--listen", "127.0.0.1:0", "--state-dir", join(daemon.dir, "state"),
    "--provider", daemon.provider, "--log-level", "warn", "--net-prefix", "n" + randomBytes(2).toString("hex"),
    "--policy-egress", "internal", ...(daemon.provider === "container" ? ["--pull", "never"] : [])],
    { env: { ...process.env, TAI42_TOKEN: daemon.token }, stdio: ["ignore", "ignore", "pipe"] });
  daemon.url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("tai42 serve did not start: " + daemon.log)), 30000);
    daemon.proc.stderr.on("data", (b) => {
      daemon.log += b.toString();
      const m = daemon.log.match(/listening on (\S+)/);
      if (m) { clearTimeout(timer); resolve("http://" + m[1]); }
    });
    daemon.proc.on("exit", (code) => reject(new Error(`tai42 serve exited ${code}: ${daemon.log}`)));
  });
});

after(async () => {
  if (daemon.proc && daemon.proc.exitCode === null) {
    const exited = new Promise((resolve) => daemon.proc.on("exit", resolve));
    process.kill(daemon.proc.pid, "SIGTERM");
    await exited;
  }
  rmSync(daemon.dir, { recursive: true, force: true });
});

// sessionIds lists the daemon's live sessions over its REST API.
async function sessionIds() {
  const res = await fetch(daemon.url + "/v1/sessions", { headers: { Authorization: "Bearer " + daemon.token } });
  assert.equal(res.status, 200);
  const body = await res.json();
  return body.sessions.map((s) => s.id);
}

const transports = {
  // tai42 mcp refuses a daemon of the host runner (no sandbox) unless
  // opted into.
  stdio: () => new StdioClientTransport({ command: bin, args: ["mcp"], stderr: "pipe",
    env: { PATH: process.env.PATH, TAI42_URL: daemon.url, TAI42_TOKEN: daemon.token,
      ...(daemon.provider === "host" ? { TAI42_ALLOW_UNSANDBOXED: "true" } : {}) } }),
  http: () => new StreamableHTTPClientTransport(new URL(daemon.url + "/mcp"),
    { requestInit: { headers: { Authorization: "Bearer " + daemon.token } } }),
};

async function connect(kind) {
  const transport = transports[kind]();
  const client = new Client({ name: "tai42-node-test", version: "0" });
  await client.connect(transport);
  // disconnect ends the connection as an agent does: the HTTP session
  // deleted, or the stdio server's stdin closed.
  const disconnect = async () => {
    if (kind === "http") await transport.terminateSession();
    await client.close();
  };
  return { client, disconnect };
}

async function ok(client, name, args = {}) {
  const res = await client.callTool({ name, arguments: args });
  assert.ok(!res.isError, `${name}: ${JSON.stringify(res.content)}`);
  assert.ok(res.structuredContent, `${name}: no structured content`);
  return res.structuredContent;
}

async function fails(client, name, args, ...want) {
  const res = await client.callTool({ name, arguments: args });
  const text = res.content.map((c) => c.text || "").join("");
  assert.ok(res.isError, `${name}: want a tool error, got ${text}`);
  for (const w of want) assert.ok(text.includes(w), `${name}: ${JSON.stringify(text)} does not say ${JSON.stringify(w)}`);
  return text;
}

// readUntil reads a process's output until stdout+stderr holds want.
async function readUntil(client, pid, cursor, want) {
  let seen = "";
  const deadline = Date.now() + 30000;
  for (;;) {
    const r = await ok(client, "read_process_output", { process_id: pid, cursor, wait_seconds: 5 });
    seen += r.stdout + r.stderr;
    cursor = r.next_cursor;
    if (seen.includes(want)) return { seen, cursor };
    assert.ok(r.running && Date.now() < deadline, `no ${JSON.stringify(want)} in ${JSON.stringify(seen)} (running ${r.running})`);
  }
}

for (const kind of Object.keys(transports)) {
  test(`${kind}: the tools and their schemas`, async () => {
    const { client, disconnect } = await connect(kind);
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
    const ajv = new AjvJsonSchemaValidator();
    for (const t of tools) {
      assert.ok(t.description.length > 40, `${t.name}: description ${JSON.stringify(t.description)}`);
      assert.equal(t.inputSchema.type, "object");
      ajv.getValidator(t.inputSchema); // throws on a schema that does not compile
      ajv.getValidator(t.outputSchema);
    }
    const create = ajv.getValidator(tools.find((t) => t.name === "create_session").inputSchema);
    assert.ok(create({ network: "none", ttl_seconds: 60 }).valid);
    assert.ok(!create({ network: "lan" }).valid);
    assert.ok(!create({ bogus: 1 }).valid);
    await disconnect();
  });

  test(`${kind}: sessions, commands, files and a background server`, async () => {
    const { client, disconnect } = await connect(kind);
    const s = await ok(client, "create_session", { image: "host", ttl_seconds: 300, labels: { via: kind } });
    assert.match(s.session_id, /^sb-/);
    // The agent is told what isolation it really has: none on the host runner.
    assert.deepEqual([s.isolation, s.network], [daemon.provider === "host" ? "none" : "container", "none"]);
    const r = await ok(client, "run", { session_id: s.session_id, command: "echo out; echo err >&2; exit 3" });
    assert.deepEqual([r.exit_code, r.stdout, r.stderr], [3, "out\n", "err\n"]);
    const r2 = await ok(client, "run", { session_id: s.session_id, argv: ["cat"], stdin: "piped" });
    assert.equal(r2.stdout, "piped");

    await ok(client, "write_file", { session_id: s.session_id, path: "www/hello.txt", content: "hello from " + kind });
    const bin = Buffer.from([0, 1, 2, 253, 254, 255]);
    await ok(client, "write_file", { session_id: s.session_id, path: "b.bin", content: bin.toString("base64"), encoding: "base64" });
    const t = await ok(client, "read_file", { session_id: s.session_id, path: "www/hello.txt" });
    assert.deepEqual([t.content, t.encoding, t.eof], ["hello from " + kind, "text", true]);
    const b = await ok(client, "read_file", { session_id: s.session_id, path: "b.bin" });
    assert.equal(b.encoding, "base64");
    assert.deepEqual(Buffer.from(b.content, "base64"), bin);
    const l = await ok(client, "list_dir", { session_id: s.session_id });
    assert.deepEqual(l.entries.map((e) => `${e.name}:${e.type}`).sort(), ["b.bin:file", "www:dir"]);

    // A background HTTP server in the session, its output read as it runs.
    const p = await ok(client, "start_process", { session_id: s.session_id, cwd: "www",
      argv: ["python3", "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"] });
    const { seen, cursor } = await readUntil(client, p.process_id, 0, "Serving HTTP");
    const port = seen.match(/port (\d+)/)[1];
    const got = await ok(client, "run", { session_id: s.session_id, argv: ["python3", "-c",
      `import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:${port}/hello.txt').read().decode())`] });
    assert.equal(got.stdout, "hello from " + kind + "\n");
    await readUntil(client, p.process_id, cursor, "GET /hello.txt");
    const listed = await ok(client, "list_processes");
    assert.deepEqual(listed.processes.map((x) => [x.process_id, x.running]), [[p.process_id, true]]);
    const k = await ok(client, "kill_process", { process_id: p.process_id });
    assert.ok([137, 143].includes(k.exit_code), JSON.stringify(k));

    await ok(client, "destroy_session", { session_id: s.session_id });
    assert.ok(!(await sessionIds()).includes(s.session_id));
    await disconnect();
  });

  test(`${kind}: errors are tool errors with the cause`, async () => {
    const { client, disconnect } = await connect(kind);
    const s = await ok(client, "create_session", { image: "host" });
    await fails(client, "run", { session_id: s.session_id, command: "printf abc; exec sleep 30", timeout_seconds: 0.5 },
      "timed out after 500ms", "3 bytes to stdout");
    await fails(client, "create_session", { image: "host", network: "egress" }, "network", "policy");
    await fails(client, "read_file", { session_id: s.session_id, path: "no/such.txt" }, "no/such.txt");
    await fails(client, "run", { session_id: "sb-missing", argv: ["true"] }, "sb-missing");
    await fails(client, "run", { session_id: s.session_id, argv: "true" }, "argv");
    // The connection still works after all that.
    const r = await ok(client, "run", { session_id: s.session_id, argv: ["true"] });
    assert.equal(r.exit_code, 0);
    await disconnect();
  });

  test(`${kind}: a disconnect destroys the connection's sessions`, async () => {
    const { client, disconnect } = await connect(kind);
    const a = await ok(client, "create_session", { image: "host" });
    const b = await ok(client, "create_session", { image: "host" });
    await ok(client, "start_process", { session_id: a.session_id, argv: ["sleep", "300"] });
    assert.ok((await sessionIds()).includes(a.session_id));
    await disconnect();
    const deadline = Date.now() + 20000;
    for (;;) {
      const ids = await sessionIds();
      if (!ids.includes(a.session_id) && !ids.includes(b.session_id)) break;
      assert.ok(Date.now() < deadline, `sessions left after the disconnect: ${ids}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  });
}

test("the HTTP endpoint refuses a missing or wrong token", async () => {
  const init = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "t", version: "0" } } });
  for (const auth of [undefined, "Bearer wrong-token"]) {
    const headers = { "Content-Type": "application/json", Accept: "application/json, text/event-stream" };
    if (auth) headers.Authorization = auth;
    const res = await fetch(daemon.url + "/mcp", { method: "POST", headers, body: init });
    assert.equal(res.status, 401);
    await res.body?.cancel();
  }
  const client = new Client({ name: "t", version: "0" });
  await assert.rejects(client.connect(new StreamableHTTPClientTransport(new URL(daemon.url + "/mcp"),
    { requestInit: { headers: { Authorization: "Bearer wrong-token" } } })));
});
