// An `engine: openai` replica in the worker, in place of an engine core: requests go to a model server that batches
// by itself (vLLM, SGLang, TGI, llama.cpp's server, another switchyard) over the OpenAI API, at most `sequences` at
// once; the rest wait in switchyard's bounded queue, never the server's. Its reports are a core's (`seq.progress`:
// `s` when a request is sent, `t` per token as it streams, `f` with the finish, `p` when the server failed it and it
// waits to go again; the load from its own counts and the server's scraped gauges), coalesced on a short interval.
//
// Life, as the engine manager sees it (the EngineHost contract): `loading` until the server (started here from the
// command, or attached at its URL) answers its health path and the vocabulary is loaded; `ready`; `failed` when the
// server exits, a stream makes no progress within `hangMs`, or `maxErrors` errors come in a row (health probes,
// server errors); `stopped` after an unload. A failed server is killed (its whole process group). With
// `upstream.sleep`, an unload puts a started server to sleep and parks it in the worker instead of stopping it, and a
// load on the same GPUs wakes it instead of starting another (./sleep.ts).
import type { Clock, TimerId } from '../../../runtime/clock.ts';
import { createWallClock } from '../../../runtime/clock.ts';
import type { CoreLimits, CoreReport, SeqEvent, SubmitSeq } from '../../../machines/core-messages.ts';
import type { WireEngineSpec, WireUpstreamSpec } from '../../../machines/messages.ts';
import { EngineError, type EngineCapacity, type EngineFailure } from '../../engine/engine.ts';
import type { EngineHost, HostState, HostStateChanged } from '../../engine/host-client.ts';
import type { HostStats } from '../../engine/host-protocol.ts';
import { upstreamUrlProblem } from './url.ts';
import { completionBody, streamCompletion } from './completion.ts';
import { loadCodec, type ModelCodec } from './codec.ts';
import { parseGauges, METRICS_BOUNDS, type UpstreamGauges } from './gauges.ts';
import { createUpstreamHttp, type UpstreamHttp } from './http.ts';
import { createRequestLedger, type RequestLedger, type UpstreamReq } from './ledger.ts';
import { commandRefusal, fillCommand, freePort, startServerProcess, type ServerProcess } from './server.ts';
import { park, parkingKey, sleepServer, unpark, wakeServer, type ExitRoute } from './sleep.ts';

/** How an upstream replica is started and bounded. */
export interface UpstreamHostOptions {
  id: string;
  epoch: number;
  engine: WireEngineSpec & { upstream: WireUpstreamSpec };
  gpus: readonly number[];
  limits: CoreLimits;
  report(r: CoreReport): void;
  /** Lifecycle lines (start, ready, failures); default: the worker's stderr. */
  log?(line: string): void;
  /** The worker's wall clock (a fresh one by default). */
  clock?: Clock;
  /** The vocabulary (tests inject one); default: a vocab-only load of the engine's file. */
  codec?(file: string): Promise<ModelCodec>;
  /** The worker's environment, for the command allow-list. */
  env?: NodeJS.ProcessEnv;
  /** Report coalescing (ms) for tokens after a request's first; health probe and gauge scrape periods (ms). */
  reportMs?: number;
  healthMs?: number;
  scrapeMs?: number;
}

/** An upstream replica: an engine host, plus its server's log and address. */
export interface UpstreamHost extends EngineHost {
  logLines(): string[];
  readonly base: string | undefined;
  readonly gauges: UpstreamGauges;
}

let sharedClock: Clock | null = null;

/** Starts an upstream replica (it is `loading` until its server answers). */
export function startUpstreamHost(o: UpstreamHostOptions): UpstreamHost {
  const r = new UpstreamReplica(o);
  void r.load();
  return r;
}

class UpstreamReplica implements UpstreamHost {
  readonly id: string;
  state: HostState = 'loading';
  base: string | undefined;
  gauges: UpstreamGauges = { waiting: null, running: null, kvUsage: null };
  private readonly o: UpstreamHostOptions;
  private readonly spec: WireUpstreamSpec;
  private readonly clock: Clock;
  private readonly ledger: RequestLedger;
  private readonly listeners = new Set<(e: HostStateChanged) => void>();
  private readonly settled: Promise<void>;
  private settle!: (ok: boolean, f?: EngineFailure) => void;
  private proc: ServerProcess | null = null;
  /** Where the server's exit goes: this replica while it is this replica's. */
  private readonly route: ExitRoute = { exit: (code, signal) => this.onExit(code, signal) };
  private http: UpstreamHttp | null = null;
  private codec: ModelCodec | null = null;
  private events: SeqEvent[] = [];
  private flushAt = -1;
  private flushTimer: TimerId | null = null;
  private tickTimer: TimerId | null = null;
  private received = 0;
  private cancelled = 0;
  private errors = 0;
  private pausedUntil = 0;
  private lastHealth = 0;
  private lastScrape = 0;
  private probing = false;
  private exited: (() => void) | null = null;

  constructor(o: UpstreamHostOptions) {
    this.o = o;
    this.id = o.id;
    this.spec = o.engine.upstream;
    this.clock = o.clock ?? (sharedClock ??= createWallClock());
    this.ledger = createRequestLedger(o.limits, this.spec.queue);
    this.settled = new Promise<void>((resolve, reject) => {
      this.settle = (ok, f) => (ok ? resolve() : reject(new EngineError(f!.code, f!.message, f!.retryable)));
    });
    this.settled.catch(() => undefined);
  }

  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** The worker's log, else its stderr: an operator sees why a server failed (with the tail of its own log). */
  private log(line: string): void {
    const l = `upstream ${this.id}@${this.o.epoch}: ${line}`;
    if (this.o.log) this.o.log(l);
    else process.stderr.write(`${l}\n`);
  }

  private moveTo(to: HostState, failure?: EngineFailure): void {
    const from = this.state;
    if (from === to) return;
    this.state = to;
    if (to === 'ready') this.settle(true);
    if (to === 'failed' || to === 'stopped')
      this.settle(false, failure ?? { code: 'not_loaded', message: `upstream ${this.id} ${to}`, retryable: true });
    const ev: HostStateChanged = {
      type: 'host.state_changed',
      host: this.id,
      from,
      to,
      ...(failure ? { failure } : {}),
    };
    for (const l of [...this.listeners]) l(ev);
  }

  /** Starts the server (or checks the URL), loads the vocabulary, and waits for the health path. */
  async load(): Promise<void> {
    const s = this.spec;
    const codec = (this.o.codec ?? loadCodec)(this.o.engine.file);
    try {
      if (s.command) {
        const refused = commandRefusal(s.command[0] ?? '', this.o.env ?? process.env);
        if (refused) return this.fail(refused, 'invalid_request');
        if (s.sleep && (await this.wake(codec))) return;
        if (this.state !== 'loading') return;
        const port = await freePort();
        if (this.state !== 'loading') return;
        const argv = fillCommand(s.command, { port, gpus: this.o.gpus, model: s.model });
        this.base = `http://127.0.0.1:${port}`;
        this.log(`starting ${argv.join(' ').slice(0, 300)} on GPUs ${this.o.gpus.join(',')}`);
        this.proc = startServerProcess({
          argv,
          cwd: s.cwd,
          env: s.env,
          gpus: this.o.gpus,
          logLines: s.logLines,
          exited: (code, signal) => this.route.exit(code, signal),
        });
      } else {
        const bad = upstreamUrlProblem(s.url ?? '', true);
        if (bad) return this.fail(`its url ${bad}`, 'invalid_request');
        this.base = s.url!;
      }
      this.http = createUpstreamHttp(this.base, this.o.limits.maxRunning + 4);
      this.codec = await codec;
    } catch (e) {
      return this.fail(`cannot start: ${(e as Error).message}`);
    }
    if (this.state !== 'loading') return;
    this.waitHealthy(this.clock.now() + s.startTimeoutMs);
  }

  /** Wakes the server parked for these GPUs, if there is one; true when it is awake and this replica's (loading
   * goes on with its health path). A server that does not wake is stopped: the caller starts a fresh one. */
  private async wake(codec: Promise<ModelCodec>): Promise<boolean> {
    const p = unpark(parkingKey(this.spec, this.o.gpus));
    if (!p) return false;
    const now = (): number => this.clock.now();
    p.route.exit = (code, signal) => this.route.exit(code, signal);
    this.proc = p.proc;
    this.base = p.base;
    this.http = p.http;
    const slept = await p.asleep;
    const woke = 'error' in slept ? slept : await wakeServer(p.http, this.spec.startTimeoutMs, now);
    if (this.state !== 'loading') return true;
    if ('error' in woke) {
      this.log(`its sleeping server (pid ${p.proc.pid}) did not wake (${woke.error}): starting a new one`);
      p.route.exit = () => undefined;
      p.proc.signal('SIGKILL');
      p.http.close();
      this.proc = this.http = null;
      this.base = undefined;
      return false;
    }
    this.log(
      `woke its server (pid ${p.proc.pid}) in ${Math.round(woke.ms)} ms (it fell asleep in ${Math.round((slept as { ms: number }).ms)} ms)`,
    );
    this.codec = await codec;
    if (this.state === 'loading') this.waitHealthy(this.clock.now() + this.spec.startTimeoutMs);
    return true;
  }

  private waitHealthy(deadline: number): void {
    if (this.state !== 'loading') return;
    void this.http!.call('GET', this.spec.health, { timeoutMs: 2_000, maxBytes: 1 << 16 }).then((r) => {
      if (this.state !== 'loading') return;
      if ('status' in r && r.status === 200) {
        this.log(`ready at ${this.base}`);
        this.moveTo('ready');
        this.tickTimer = this.clock.setTimeout(() => this.tick(), this.tickMs());
        return;
      }
      if (this.clock.now() > deadline)
        return this.fail(
          `its health path ${this.spec.health} did not answer 200 within ${this.spec.startTimeoutMs} ms`,
        );
      this.clock.setTimeout(() => this.waitHealthy(deadline), 250);
    });
  }

  private onExit(code: number | null, signal: NodeJS.Signals | null): void {
    this.exited?.();
    if (this.state === 'failed' || this.state === 'stopped') return;
    const tail = this.proc?.log.lines().slice(-5).join(' | ') ?? '';
    this.fail(`its server exited (${signal ?? `code ${code}`})${tail ? `: ${tail.slice(0, 600)}` : ''}`);
  }

  /** The replica failed: every stream closed, the server killed; the control plane re-homes what it held. */
  private fail(message: string, code: EngineFailure['code'] = 'engine_failed'): void {
    if (this.state === 'failed' || this.state === 'stopped') return;
    this.log(`failed: ${message}`);
    this.shutDown('SIGKILL');
    this.moveTo('failed', { code, message: `upstream ${this.id}: ${message}`, retryable: code === 'engine_failed' });
  }

  /** Closes every stream and timer; the server gets `signal` (none: it is kept, to be parked). */
  private shutDown(signal: NodeJS.Signals | null): void {
    for (const r of this.ledger.clear()) r.close?.();
    if (this.flushTimer !== null) this.clock.clearTimeout(this.flushTimer);
    if (this.tickTimer !== null) this.clock.clearTimeout(this.tickTimer);
    this.flushTimer = this.tickTimer = null;
    this.events = [];
    if (signal === null) return;
    this.proc?.signal(signal);
    this.http?.close();
  }

  private tickMs(): number {
    return Math.max(50, Math.min(1_000, this.spec.hangMs / 4));
  }

  /** Hang check of every stream, health probe and gauge scrape, on the clock. */
  private tick(): void {
    this.tickTimer = null;
    if (this.state !== 'ready' && this.state !== 'draining') return;
    const now = this.clock.now();
    for (const r of this.ledger.running) {
      if (now - r.lastAt > this.spec.hangMs)
        return this.fail(
          `request ${r.seq.id} made no progress for ${Math.round(now - r.lastAt)} ms (hang bound ${this.spec.hangMs} ms)`,
        );
    }
    if (!this.probing && now - this.lastHealth >= (this.o.healthMs ?? 2_000)) this.probeHealth(now);
    if (now - this.lastScrape >= (this.o.scrapeMs ?? 1_000)) this.scrape(now);
    if (now < this.pausedUntil || this.ledger.waiting() > 0) this.dispatch();
    this.tickTimer = this.clock.setTimeout(() => this.tick(), this.tickMs());
  }

  private probeHealth(now: number): void {
    this.lastHealth = now;
    this.probing = true;
    const timeoutMs = Math.max(500, Math.min(5_000, this.spec.hangMs));
    void this.http!.call('GET', this.spec.health, { timeoutMs, maxBytes: 1 << 16 }).then((r) => {
      this.probing = false;
      if (this.state !== 'ready' && this.state !== 'draining') return;
      if ('status' in r && r.status === 200) return void (this.errors = 0);
      this.error(`health ${'error' in r ? r.error : `answered ${r.status}`}`);
    });
  }

  private scrape(now: number): void {
    this.lastScrape = now;
    void this.http!.call('GET', this.spec.metrics, { timeoutMs: 2_000, maxBytes: METRICS_BOUNDS.maxBytes }).then(
      (r) => {
        if (!('status' in r) || r.status !== 200) return;
        this.gauges = parseGauges(r.text, this.spec.gauges);
      },
    );
  }

  /** An error of the server (not of one request): `maxErrors` in a row fail the replica. */
  private error(why: string): void {
    // Errors during the back-off of an earlier one are that one's (streams the same fault closed at once).
    if (this.clock.now() < this.pausedUntil) return this.log(`error during back-off: ${why}`);
    this.errors++;
    this.log(`error ${this.errors}/${this.spec.maxErrors}: ${why}`);
    if (this.errors >= this.spec.maxErrors) this.fail(`${this.errors} errors in a row, the last: ${why}`);
    else this.pausedUntil = this.clock.now() + 250 * this.errors;
  }

  capacity(): EngineCapacity | undefined {
    return undefined;
  }
  stats(): HostStats | undefined {
    return undefined;
  }
  subscribe(listener: (event: HostStateChanged) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
  ready(): Promise<void> {
    return this.settled;
  }
  tokenize(text: string): Promise<number[]> {
    return this.settled.then(() => this.codec!.encode(text));
  }
  logLines(): string[] {
    return this.proc?.log.lines() ?? [];
  }

  submit(seqs: readonly SubmitSeq[]): void {
    if (this.state !== 'ready') throw new EngineError('not_loaded', `upstream ${this.id} is ${this.state}`, true);
    this.received += seqs.length;
    for (const seq of seqs) {
      const left = seq.maxTokens - seq.generated;
      const req: UpstreamReq = {
        seq,
        context: seq.promptTokens + seq.generated,
        left,
        made: 0,
        ids: [],
        running: false,
        close: null,
        lastAt: 0,
        first: false,
        sentAt: 0,
      };
      if (left <= 0) this.push({ k: 'f', id: seq.id, reason: 'length' });
      else if (!this.ledger.enqueue(req))
        this.push({ k: 'f', id: seq.id, reason: 'done', error: `overloaded: upstream ${this.id}'s queue is full` });
    }
    this.dispatch();
    this.flushSoon(0);
  }

  cancel(ids: readonly string[]): number {
    this.cancelled += ids.length;
    let n = 0;
    for (const id of ids) {
      const r = this.ledger.remove(id);
      if (!r) continue;
      n++;
      r.close?.();
    }
    if (this.state === 'ready' || this.state === 'draining') {
      this.dispatch();
      this.flushSoon(0);
    }
    return n;
  }

  cancelAll(): number {
    const ids = [...this.ledger.byId.keys()];
    return this.cancel(ids);
  }

  probe(): Promise<EngineCapacity> {
    return Promise.reject(new EngineError('not_loaded', 'an upstream server has no engine capacity to probe', false));
  }

  drain(): void {
    if (this.state === 'ready') this.moveTo('draining');
  }

  unload(): Promise<void> {
    if (this.state === 'failed' || this.state === 'stopped') return Promise.resolve();
    if (this.spec.sleep && this.proc && this.http && this.base && this.state !== 'loading') return this.sleep();
    const gone = new Promise<void>((resolve) => (this.exited = resolve));
    this.shutDown('SIGTERM');
    this.moveTo('stopped');
    return this.proc && this.proc.pid !== undefined ? gone : Promise.resolve();
  }

  kill(): void {
    this.fail('killed');
  }

  /** Puts the server to sleep and parks it (this replica stops at once); a server that does not fall asleep is
   * stopped. Resolves once it sleeps or is stopped. */
  private sleep(): Promise<void> {
    const proc = this.proc!;
    const http = this.http!;
    this.shutDown(null);
    this.moveTo('stopped');
    this.proc = this.http = null;
    const timeoutMs = Math.min(this.spec.startTimeoutMs, 600_000);
    const asleep = sleepServer(http, timeoutMs, () => this.clock.now()).then((r) => {
      if ('error' in r) {
        this.log(`its server (pid ${proc.pid}) did not fall asleep (${r.error}): stopping it`);
        proc.signal('SIGKILL');
      } else this.log(`put its server (pid ${proc.pid}) to sleep in ${Math.round(r.ms)} ms`);
      return r;
    });
    park({
      key: parkingKey(this.spec, this.o.gpus),
      gpus: this.o.gpus,
      proc,
      route: this.route,
      base: this.base!,
      http,
      asleep,
    });
    return asleep.then(() => undefined);
  }

  /** Sends waiting requests while slots are free (not while the server is in a back-off after an error). */
  private dispatch(): void {
    if (this.state !== 'ready' && this.state !== 'draining') return;
    if (this.clock.now() < this.pausedUntil) return;
    for (let r = this.ledger.next(); r; r = this.ledger.next()) this.send(r);
  }

  private send(r: UpstreamReq): void {
    this.ledger.start(r);
    r.lastAt = this.clock.now();
    r.first = false;
    r.sentAt = r.made;
    this.push({ k: 's', id: r.seq.id });
    const seq =
      r.made > 0 ? { ...r.seq, out: [...(r.seq.out ?? []), ...r.ids], generated: r.seq.generated + r.made } : r.seq;
    const body = completionBody(this.spec, seq, r.left - r.made, this.codec, this.codec?.bos ?? null);
    r.close = streamCompletion(this.http!, body, this.codec, {
      accepted: () => void (r.lastAt = this.clock.now()),
      tokens: (ids, text) => this.onTokens(r, ids, text),
      finished: (reason, usage) => this.onFinished(r, reason, usage),
      failed: (whose, message) => this.onFailed(r, whose, message),
    });
  }

  private live(r: UpstreamReq): boolean {
    return (this.state === 'ready' || this.state === 'draining') && this.ledger.byId.get(r.seq.id) === r && r.running;
  }

  private onTokens(r: UpstreamReq, ids: number[], text: string): void {
    if (!this.live(r)) return;
    r.lastAt = this.clock.now();
    this.errors = 0;
    const urgent = !r.first;
    // Never more than it may make: the server was asked for no more, so any excess is dropped.
    const n = Math.min(r.left - r.made, Math.max(1, ids.length));
    for (let i = 0; i < n; i++) {
      const id = ids[i];
      if (id !== undefined) r.ids.push(id);
      r.made++;
      const t = i === 0 ? text : '';
      // Ids always (none when the server's text had none): the control plane takes a token's text with its ids.
      this.events.push({ k: 't', id: r.seq.id, n: 1, ids: id !== undefined ? [id] : [], text: t });
    }
    r.first = true;
    this.flushSoon(urgent ? 0 : (this.o.reportMs ?? 5));
  }

  private onFinished(r: UpstreamReq, reason: 'stop' | 'length', usage: number | null): void {
    if (!this.live(r)) return;
    // The server's count is the truth: tokens it made that its text did not show are counted (no text, no id).
    const extra = usage === null ? 0 : Math.max(0, Math.min(r.left - r.sentAt, usage) - (r.made - r.sentAt));
    for (let i = 0; i < extra; i++) this.events.push({ k: 't', id: r.seq.id, n: 1, ids: [], text: '' });
    r.made += extra;
    this.ledger.remove(r.seq.id);
    this.events.push({ k: 'f', id: r.seq.id, reason: r.made >= r.left ? 'length' : reason });
    this.dispatch();
    this.flushSoon(0);
  }

  private onFailed(r: UpstreamReq, whose: 'request' | 'server', message: string): void {
    if (!this.live(r)) return;
    if (whose === 'request') {
      this.ledger.remove(r.seq.id);
      this.push({ k: 'f', id: r.seq.id, reason: 'done', error: `invalid_request: ${message}` });
      this.dispatch();
      return;
    }
    // Back to the head of its class, keeping its tokens; the server's error counts toward failing the replica.
    this.ledger.requeue(r);
    this.push({ k: 'p', id: r.seq.id });
    this.error(`request ${r.seq.id}: ${message}`);
    this.dispatch();
  }

  private push(e: SeqEvent): void {
    this.events.push(e);
    this.flushSoon(0);
  }

  /** A report within `ms` (0: on the next turn); an earlier one already due is kept. */
  private flushSoon(ms: number): void {
    const at = this.clock.now() + ms;
    if (this.flushTimer !== null) {
      if (this.flushAt <= at) return;
      this.clock.clearTimeout(this.flushTimer);
    }
    this.flushAt = at;
    this.flushTimer = this.clock.setTimeout(() => this.flush(), ms);
  }

  private flush(): void {
    this.flushTimer = null;
    if (this.state !== 'ready' && this.state !== 'draining') return;
    const now = this.clock.now();
    const events = this.events;
    this.events = [];
    const load = this.ledger.load({ received: this.received, cancelled: this.cancelled, kvUsage: this.gauges.kvUsage });
    this.o.report({ at: now, start: now, events, load });
  }
}
