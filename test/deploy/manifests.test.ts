// Validates the rendered fleets: byte-identical to a fresh rendering, core objects against the Kubernetes API schemas
// (kubernetes-models), custom resources against our own structural checks, and the rules a fleet must keep.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Deployment } from 'kubernetes-models/apps/v1';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { Role, RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { ConfigMap, Secret, Service, ServiceAccount } from 'kubernetes-models/v1';
import type { IContainer } from 'kubernetes-models/v1';
import type { IDeployment } from 'kubernetes-models/apps/v1';
import type { INetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1';
import { BlockList, isIPv4 } from 'node:net';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { driftFrom, MANIFESTS_DIR, renderFleet, renderFleetFile, REPO_ROOT } from '../../deploy/render.ts';
import { fleetModels, FleetError, parseFleet } from '../../deploy/lib/fleet.ts';
import { normalizeScenario } from '../../actors/config.ts';
import { TOKEN_PLACEHOLDER } from '../../deploy/lib/fleet-wide.ts';
import { CLIENT_PATHS, METRICS, SOURCE_FLAGS, TOKEN_KEYS, WORKER_SOURCES } from '../../deploy/lib/switchyard-cli.ts';
import { parseCommand } from '../../bin/args.ts';
import { FLAGS as SERVE_FLAGS } from '../../bin/serve-command.ts';
import { FLAGS as NODE_AGENT_FLAGS } from '../../bin/node-agent-command.ts';
import { checkHTTPRoute, checkInferencePool, checkPodMonitor } from './crd-checks.ts';

type Obj = Record<string, any>;

const FLEETS = ['small-only', 'mixed-2x2', 'large-heavy', 'real-gguf'];

/** kubernetes-models classes by kind: `validate()` throws on a schema violation. */
const CORE: Record<string, (o: Obj) => { validate(): void }> = {
  Deployment: (o) => new Deployment(o as never),
  Service: (o) => new Service(o as never),
  ConfigMap: (o) => new ConfigMap(o as never),
  Secret: (o) => new Secret(o as never),
  ServiceAccount: (o) => new ServiceAccount(o as never),
  PodDisruptionBudget: (o) => new PodDisruptionBudget(o as never),
  NetworkPolicy: (o) => new NetworkPolicy(o as never),
  Role: (o) => new Role(o as never),
  RoleBinding: (o) => new RoleBinding(o as never),
};
const CUSTOM: Record<string, (o: Obj) => string[]> = {
  InferencePool: checkInferencePool,
  HTTPRoute: checkHTTPRoute,
  PodMonitor: checkPodMonitor,
};

function docs(text: string): Obj[] {
  return parseAllDocuments(text).map((d) => d.toJS() as Obj);
}

function matches(selector: Record<string, string>, labels: Record<string, string> = {}): boolean {
  return Object.entries(selector).every(([k, v]) => labels[k] === v);
}

/** True when an HTTPRoute match's path accepts `path` (Gateway API: Exact, or PathPrefix by whole segments). */
function pathMatches(match: Obj, path: string): boolean {
  const { type, value } = match.path as { type: string; value: string };
  if (type === 'Exact') return path === value;
  const prefix = value.endsWith('/') ? value.slice(0, -1) : value;
  return path === prefix || path.startsWith(`${prefix}/`);
}

/** The value following `flag` in a command line, or undefined. */
function flagValue(args: readonly string[], flag: string): string | undefined {
  const i = args.indexOf(flag);
  return i >= 0 ? args[i + 1] : undefined;
}

/** A fleet rendered afresh, its manifest objects, and accessors the tests share. */
function loadRendered(fleetName: string) {
  const { fleet, files } = renderFleetFile(join(REPO_ROOT, 'deploy', 'fleets', `${fleetName}.yaml`));
  const dir = join(REPO_ROOT, 'deploy', 'rendered', fleetName);
  const objects = files.filter((f) => f.path.startsWith(`${MANIFESTS_DIR}/`)).flatMap((f) => docs(f.text));
  const ofKind = (kind: string): Obj[] => objects.filter((o) => o['kind'] === kind);
  const nodeDeployments = ofKind('Deployment').filter(
    (d) => d.metadata.labels['app.kubernetes.io/component'] === 'node',
  );
  const containers = (d: Obj): IContainer[] => (d as IDeployment).spec!.template.spec!.containers;
  const byName = (d: Obj, name: string): IContainer => containers(d).find((c) => c.name === name)!;
  return { fleet, files, dir, objects, ofKind, nodeDeployments, containers, byName };
}

describe.each(FLEETS)('the rendered %s fleet', (fleetName) => {
  const { fleet, files, dir, objects, ofKind, nodeDeployments, containers, byName } = loadRendered(fleetName);

  it('renders to exactly the committed bytes', () => {
    expect(driftFrom(dir, files)).toEqual([]);
  });

  it('passes the Kubernetes API schema for every core object', () => {
    const core = objects.filter((o) => CORE[o['kind']]);
    expect(core.length).toBeGreaterThan(10);
    for (const o of core) expect(() => CORE[o['kind']]!(o).validate(), `${o['kind']} ${o.metadata.name}`).not.toThrow();
    expect(objects.every((o) => CORE[o['kind']] || CUSTOM[o['kind']])).toBe(true);
  });

  it('passes the structural check of every custom resource', () => {
    for (const o of objects.filter((x) => CUSTOM[x['kind']])) {
      expect(CUSTOM[o['kind']]!(o), `${o['kind']} ${o.metadata.name}`).toEqual([]);
    }
    expect(ofKind('InferencePool')).toHaveLength(fleetModels(fleet).length);
    expect(ofKind('PodMonitor')).toHaveLength(1);
    expect(ofKind('HTTPRoute')).toHaveLength(1);
  });

  it('runs one Deployment per pool whose pods are whole 8-GPU nodes', () => {
    expect(nodeDeployments.map((d) => d.metadata.name).sort()).toEqual(
      fleet.pools.map((p) => `${fleet.name}-${p.name}`).sort(),
    );
    for (const d of nodeDeployments) {
      const gpus = containers(d).map((c) => Number(c.resources?.limits?.['nvidia.com/gpu'] ?? 0));
      expect(gpus.reduce((a, b) => a + b, 0)).toBe(8);
      expect(byName(d, 'worker').resources?.limits?.['nvidia.com/gpu']).toBe(8);
      expect(d.spec.replicas).toBe(fleet.pools.find((p) => d.metadata.name === `${fleet.name}-${p.name}`)!.nodes);
    }
  });

  it('runs the control plane and the worker as separate containers joined over loopback with the worker token', () => {
    for (const d of nodeDeployments) {
      expect(containers(d).map((c) => c.name)).toEqual(['control-plane', 'worker']);
      const cp = byName(d, 'control-plane');
      const worker = byName(d, 'worker');
      expect(cp.args?.slice(0, 3)).toEqual(['serve', '--config', '/etc/switchyard/config.yaml']);
      expect(cp.args?.join(' ')).toContain('--no-worker');
      expect(worker.args?.[0]).toBe('node-agent');
      expect(worker.args?.join(' ')).toContain('--url ws://127.0.0.1:8080/v1/node');
      const workerSecrets = worker.env
        ?.filter((e) => e.valueFrom?.secretKeyRef)
        .map((e) => e.valueFrom!.secretKeyRef!.key);
      expect(workerSecrets).toEqual([TOKEN_KEYS.worker.key]);
    }
  });

  it("passes each container's command line to the switchyard CLI's own strict flag parser", () => {
    for (const d of nodeDeployments) {
      const cp = byName(d, 'control-plane').args!;
      const worker = byName(d, 'worker').args!;
      expect(() => parseCommand(cp.slice(1), SERVE_FLAGS, { maxPositionals: 0 })).not.toThrow();
      expect(() => parseCommand(worker.slice(1), NODE_AGENT_FLAGS, { maxPositionals: 0 })).not.toThrow();
    }
    // The check can fail: a flag the CLI does not know is refused by name.
    expect(() => parseCommand(['--worker', 'external'], SERVE_FLAGS)).toThrow(/worker/);
  });

  it('gives every container resource requests and limits', () => {
    for (const d of ofKind('Deployment')) {
      for (const c of containers(d)) {
        expect(c.resources?.requests?.['cpu'], `${d.metadata.name}/${c.name} cpu`).toBeDefined();
        expect(c.resources?.requests?.['memory'], `${d.metadata.name}/${c.name} memory`).toBeDefined();
        expect(c.resources?.limits?.['memory'], `${d.metadata.name}/${c.name} memory limit`).toBeDefined();
      }
    }
  });

  it('gives pods a grace period of at least the preStop delay plus the drain deadline', () => {
    const { preStopSeconds, drainDeadlineSeconds } = fleet.shutdown;
    for (const d of nodeDeployments) {
      const grace = d.spec.template.spec.terminationGracePeriodSeconds as number;
      const cp = byName(d, 'control-plane');
      const preStop = cp.lifecycle?.preStop?.sleep?.seconds as number;
      expect(preStop).toBe(preStopSeconds);
      expect(grace).toBeGreaterThanOrEqual(preStop + drainDeadlineSeconds);
      expect(cp.args?.join(' ')).toContain(`--drain-ms ${drainDeadlineSeconds * 1000}`);
      // The worker is signalled only after the drain, still inside the grace period.
      const workerSleep = byName(d, 'worker').lifecycle?.preStop?.sleep?.seconds as number;
      expect(workerSleep).toBe(preStop + drainDeadlineSeconds);
      expect(grace).toBeGreaterThan(workerSleep);
    }
  });

  it('probes /healthz for liveness and /readyz for readiness, with a startup budget for the model load', () => {
    for (const d of nodeDeployments) {
      const cp = byName(d, 'control-plane');
      expect(cp.livenessProbe?.httpGet?.path).toBe('/healthz');
      expect(cp.readinessProbe?.httpGet?.path).toBe('/readyz');
      expect(cp.startupProbe?.httpGet?.path).toBe('/readyz');
      const budget = (cp.startupProbe!.periodSeconds as number) * (cp.startupProbe!.failureThreshold as number);
      expect(budget).toBeGreaterThanOrEqual(
        fleet.pools.find((p) => d.metadata.name.endsWith(`-${p.name}`))!.startupSeconds,
      );
      expect(budget).toBeGreaterThanOrEqual(600);
    }
  });

  it('runs every container non-root, with a read-only root filesystem and every capability dropped', () => {
    for (const d of ofKind('Deployment')) {
      for (const c of containers(d)) {
        const sc = c.securityContext!;
        expect(sc.runAsNonRoot, c.name).toBe(true);
        expect(sc.readOnlyRootFilesystem, c.name).toBe(true);
        expect(sc.allowPrivilegeEscalation, c.name).toBe(false);
        expect(sc.capabilities?.drop, c.name).toEqual(['ALL']);
      }
    }
  });

  it('lists every manifest in its kustomization', () => {
    const kustomization = parse(files.find((f) => f.path === 'kustomization.yaml')!.text) as Obj;
    const manifests = files.filter((f) => f.path.startsWith(`${MANIFESTS_DIR}/`)).map((f) => f.path);
    expect([...kustomization.resources].sort()).toEqual(manifests.sort());
  });
});

describe.each(FLEETS)('the %s fleet in a cluster', (fleetName) => {
  const { fleet, files, ofKind, nodeDeployments, containers, byName } = loadRendered(fleetName);

  it('selects with each InferencePool exactly the pods of the pools that serve its model', () => {
    for (const pool of ofKind('InferencePool')) {
      const selector = pool.spec.selector.matchLabels as Record<string, string>;
      const model = fleetModels(fleet).find((m) => pool.metadata.name === `${fleet.name}-${m.replace(/\./g, '-')}`)!;
      const serving = fleet.pools
        .filter((p) => p.models.some((m) => m.name === model))
        .map((p) => `${fleet.name}-${p.name}`);
      const selected = nodeDeployments.filter((d) => matches(selector, d.spec.template.metadata.labels));
      expect(selected.map((d) => d.metadata.name).sort()).toEqual(serving.sort());
      expect(pool.spec.targetPorts).toEqual([
        { number: byName(selected[0]!, 'control-plane').ports![0]!.containerPort },
      ]);
    }
  });

  it('points each InferencePool at an endpoint picker Service that reads switchyard metric names for its model', () => {
    for (const pool of ofKind('InferencePool')) {
      const ref = pool.spec.endpointPickerRef;
      const svc = ofKind('Service').find((s) => s.metadata.name === ref.name)!;
      expect(svc.spec.ports.map((p: Obj) => p.port)).toContain(ref.port.number);
      const epp = ofKind('Deployment').find((d) => matches(svc.spec.selector, d.spec.template.metadata.labels))!;
      expect(byName(epp, 'epp').args).toEqual(expect.arrayContaining(['--pool-name', pool.metadata.name]));
      const cm = ofKind('ConfigMap').find((c) => c.metadata.name === epp.spec.template.spec.volumes[0].configMap.name)!;
      const config = parse(cm.data['epp-config.yaml'] as string) as Obj;
      const extractor = config.plugins.find((p: Obj) => p.type === 'core-metrics-extractor');
      const model = pool.spec.selector.matchLabels;
      const modelName = Object.keys(model)
        .find((k) => k.startsWith('model.switchyard.dev/'))!
        .split('/')[1];
      expect(extractor.parameters.defaultEngine).toBe('switchyard');
      expect(extractor.parameters.engineConfigs).toEqual([
        {
          name: 'switchyard',
          queuedRequestsSpec: `${METRICS.queued}{model="${modelName}"}`,
          runningRequestsSpec: `${METRICS.running}{model="${modelName}"}`,
          kvUsageSpec: `${METRICS.kvUsage}{model="${modelName}"}`,
          loraSpec: '',
          cacheInfoSpec: '',
        },
      ]);
      expect(config.dataLayer.sources[0].extractors[0].pluginRef).toBe('core-metrics-extractor');
      for (const d of nodeDeployments.filter((n) => matches(model, n.spec.template.metadata.labels))) {
        expect(d.spec.template.metadata.labels['inference.networking.k8s.io/engine-type']).toBe('switchyard');
      }
    }
  });

  it('admits only the gateway, the endpoint pickers and Prometheus to the node pods', () => {
    const policy = ofKind('NetworkPolicy').find((p) => p.metadata.name === `${fleet.name}-nodes`) as INetworkPolicy;
    expect(policy.spec!.policyTypes).toEqual(['Ingress', 'Egress']);
    for (const d of nodeDeployments)
      expect(matches(policy.spec!.podSelector.matchLabels!, d.spec.template.metadata.labels)).toBe(true);
    const peers = policy.spec!.ingress!.flatMap((r) => r.from ?? []);
    expect(peers).toHaveLength(3);
    expect(peers.every((p) => p.ipBlock === undefined && p.podSelector?.matchLabels)).toBe(true);
    const namespaces = peers.map((p) => p.namespaceSelector?.matchLabels?.['kubernetes.io/metadata.name'] ?? 'own');
    expect(namespaces.sort()).toEqual([fleet.gateway.namespace, fleet.prometheus.namespace, 'own'].sort());
    const eppPeer = peers.find((p) => !p.namespaceSelector)!;
    const epps = ofKind('Deployment').filter(
      (d) => d.metadata.labels['app.kubernetes.io/component'] === 'endpoint-picker',
    );
    for (const e of epps)
      expect(matches(eppPeer.podSelector!.matchLabels!, e.spec.template.metadata.labels)).toBe(true);
    expect(policy.spec!.ingress!.flatMap((r) => r.ports ?? [])).toEqual([{ protocol: 'TCP', port: 'http' }]);
  });

  it('lets node pods reach only the cluster DNS, and endpoint pickers only DNS, the node pods and the API server', () => {
    const policy = (name: string): INetworkPolicy =>
      ofKind('NetworkPolicy').find((p) => p.metadata.name === `${fleet.name}-${name}`) as INetworkPolicy;
    const dns = {
      to: [
        {
          namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'kube-system' } },
          podSelector: { matchLabels: { 'k8s-app': 'kube-dns' } },
        },
      ],
      ports: [
        { protocol: 'UDP', port: 53 },
        { protocol: 'TCP', port: 53 },
      ],
    };
    const nodes = policy('nodes').spec!;
    expect(nodes.policyTypes).toContain('Egress');
    expect(nodes.egress).toEqual([dns]);
    const epp = policy('epp').spec!;
    expect(epp.policyTypes).toEqual(['Ingress', 'Egress']);
    expect(epp.egress).toHaveLength(3);
    expect(epp.egress![0]).toEqual(dns);
    // The pickers scrape the node pods' HTTP port, and nothing else of theirs.
    const scrape = epp.egress![1]!;
    for (const d of nodeDeployments)
      expect(matches(scrape.to![0]!.podSelector!.matchLabels!, d.spec.template.metadata.labels)).toBe(true);
    expect(scrape.ports).toEqual([
      { protocol: 'TCP', port: byName(nodeDeployments[0]!, 'control-plane').ports![0]!.containerPort },
    ]);
    // The API server: only its ports, on the addresses the fleet gives.
    const api = epp.egress![2]!;
    expect(api.to).toEqual(fleet.apiServer.cidrs.map((cidr) => ({ ipBlock: { cidr } })));
    expect(api.ports).toEqual([443, 6443].map((port) => ({ protocol: 'TCP', port })));
  });

  it('routes through the gateway only the client paths: never the worker link, the inspector, /admin or the probes', () => {
    const route = ofKind('HTTPRoute')[0]!;
    const routed = (path: string): boolean =>
      route.spec.rules.some((r: Obj) => r.matches.some((m: Obj) => pathMatches(m, path)));
    for (const path of CLIENT_PATHS) expect(routed(path), path).toBe(true);
    for (const path of ['/v1/node', '/v1/inspect', '/v1/node/', '/admin/status', '/metrics', '/healthz', '/inspector/'])
      expect(routed(path), path).toBe(false);
    expect(route.spec.hostnames ?? []).toEqual(fleet.gateway.hostnames);
  });

  it("accepts /v1/node only from where the worker dials: the pod's loopback", () => {
    for (const d of nodeDeployments) {
      const allow = flagValue(byName(d, 'control-plane').args!, SOURCE_FLAGS.workerAllow);
      expect(allow?.split(',')).toEqual([...WORKER_SOURCES]);
      const blocks = new BlockList();
      for (const entry of allow!.split(',')) {
        const [addr, bits] = entry.split('/');
        blocks.addSubnet(addr!, Number(bits), isIPv4(addr!) ? 'ipv4' : 'ipv6');
      }
      const url = new URL(flagValue(byName(d, 'worker').args!, '--url')!);
      expect(url.pathname).toBe('/v1/node');
      expect(blocks.check(url.hostname, 'ipv4')).toBe(true);
      // No address a peer of the NetworkPolicy could have (a pod or the gateway) is allowed.
      for (const other of ['10.0.0.7', '192.168.1.1', '172.16.0.1']) expect(blocks.check(other, 'ipv4')).toBe(false);
    }
  });

  it('allows as Host the gateway host names and the pod address the kubelet probes and scrapers use', () => {
    for (const d of nodeDeployments) {
      const cp = byName(d, 'control-plane');
      const hosts = flagValue(cp.args!, SOURCE_FLAGS.allowedHost);
      if (fleet.gateway.hostnames.length === 0) {
        expect(hosts).toBeUndefined();
        continue;
      }
      expect(hosts?.split(',')).toEqual([...fleet.gateway.hostnames, '$(POD_IP)']);
      expect(cp.env?.find((e) => e.name === 'POD_IP')?.valueFrom?.fieldRef?.fieldPath).toBe('status.podIP');
      // Probes that set no host name the pod by its IP, which the list allows.
      for (const probe of [cp.startupProbe, cp.livenessProbe, cp.readinessProbe]) {
        expect(probe?.httpGet?.host).toBeUndefined();
        expect(probe?.httpGet?.httpHeaders).toBeUndefined();
      }
    }
  });

  it('lets the worker open model files from its models volume only', () => {
    for (const d of nodeDeployments) {
      const worker = byName(d, 'worker');
      const models = worker.volumeMounts!.find((v) => v.name === 'models')!.mountPath;
      expect(flagValue(worker.args!, '--model-root')).toBe(models);
      expect(worker.args!.filter((a) => a === '--model-root')).toHaveLength(1);
    }
  });

  it('keeps tokens out of the manifests: only a placeholder Secret template, which no kustomization applies', () => {
    expect(ofKind('Secret')).toEqual([]);
    const template = docs(files.find((f) => f.path === 'tokens-secret.example.yaml')!.text);
    expect(template).toHaveLength(1);
    expect(() => new Secret(template[0] as never).validate()).not.toThrow();
    expect(Object.values(template[0]!.stringData)).toEqual(Object.values(TOKEN_KEYS).map(() => TOKEN_PLACEHOLDER));
    expect(template[0]!.data).toBeUndefined();
    const tokenEnv = new Set(Object.values(TOKEN_KEYS).map((t) => t.env));
    for (const d of nodeDeployments) {
      for (const e of containers(d)
        .flatMap((c) => c.env ?? [])
        .filter((x) => tokenEnv.has(x.name as never))) {
        expect(e.value).toBeUndefined();
        expect(e.valueFrom?.secretKeyRef?.name).toBe(template[0]!.metadata.name);
      }
    }
    const kustomization = parse(files.find((f) => f.path === 'kustomization.yaml')!.text) as Obj;
    expect(kustomization.resources).not.toContain('tokens-secret.example.yaml');
  });

  it('embeds a switchyard config with node, models and exclusive placement in the pool mode', () => {
    for (const pool of fleet.pools) {
      const cm = ofKind('ConfigMap').find((c) => c.metadata.name === `${fleet.name}-${pool.name}-config`)!;
      const config = parse(cm.data['config.yaml'] as string) as Obj;
      expect(Object.keys(config)).toEqual(expect.arrayContaining(['node', 'models', 'placement']));
      expect(config.placement.policy).toBe('exclusive');
      expect(config.placement.initialMode).toBe(pool.mode);
      expect(config.node.gpus).toBe(8);
      const gpusUsed = config.models.reduce((s: number, m: Obj) => s + m.tp * m.replicas, 0);
      expect(gpusUsed).toBe(8);
      for (const m of config.models) expect(m.tp).toBe(pool.mode === 'large' ? 8 : 1);
    }
  });

  it('embeds a config that the serve config schema accepts, naming llama.cpp, the file in the pod and the offload', () => {
    for (const pool of fleet.pools) {
      const cm = ofKind('ConfigMap').find((c) => c.metadata.name === `${fleet.name}-${pool.name}-config`)!;
      const config = normalizeScenario(parse(cm.data['config.yaml'] as string));
      pool.models.forEach((m, i) => {
        const engine = config.models[i]!.engine;
        if (!m.engine) {
          expect(engine, m.name).toBeUndefined();
          return;
        }
        expect(engine).toEqual({
          kind: 'llama.cpp',
          file: expect.stringMatching(new RegExp(`^/models/[^/]+/${m.engine.file.replace(/\./g, '\\.')}$`)),
          contextTokens: m.engine.contextTokens,
          sequences: m.engine.sequences,
          threads: m.engine.threads,
          ...(m.engine.gpu !== 'cpu' ? { gpu: m.engine.gpu } : {}),
          ...(m.engine.gpuLayers !== undefined ? { gpuLayers: m.engine.gpuLayers } : {}),
        });
      });
    }
  });

  it('mounts each GGUF volume read-only, under the model root, in both containers, with the file the config names', () => {
    for (const pool of fleet.pools) {
      const d = nodeDeployments.find((n) => n.metadata.name === `${fleet.name}-${pool.name}`)!;
      const cm = ofKind('ConfigMap').find((c) => c.metadata.name === `${fleet.name}-${pool.name}-config`)!;
      const files: string[] = (parse(cm.data['config.yaml'] as string) as Obj).models.flatMap((m: Obj) =>
        m.engine === 'llama.cpp' ? [m.file] : [],
      );
      const worker = byName(d, 'worker');
      const root = flagValue(worker.args!, '--model-root')!;
      const sources = (d.spec.template.spec.volumes as Obj[]).filter((v) => v.persistentVolumeClaim || v.hostPath);
      expect(sources).toHaveLength(
        new Set(pool.models.flatMap((m) => (m.engine ? [m.engine.volume] : [])).map((v) => JSON.stringify(v))).size,
      );
      for (const v of sources) {
        if (v.persistentVolumeClaim) expect(v.persistentVolumeClaim.readOnly).toBe(true);
        for (const c of containers(d)) {
          const mount = c.volumeMounts!.find((x) => x.name === v.name)!;
          expect(mount.readOnly, `${c.name} ${v.name}`).toBe(true);
          expect(mount.mountPath.startsWith(`${root}/`), mount.mountPath).toBe(true);
        }
      }
      for (const file of files) {
        const mount = worker.volumeMounts!.find((x) => file.startsWith(`${x.mountPath}/`) && x.name !== 'models');
        expect(mount?.readOnly, file).toBe(true);
        expect(file.startsWith(`${root}/`)).toBe(true);
      }
    }
  });

  it("requests and limits the pool's GPU resources on the worker, and tolerates the GPU nodes' taint", () => {
    for (const pool of fleet.pools) {
      const d = nodeDeployments.find((n) => n.metadata.name === `${fleet.name}-${pool.name}`)!;
      const r = byName(d, 'worker').resources!;
      for (const [name, count] of pool.gpuResources) {
        expect(r.requests?.[name], name).toBe(count);
        expect(r.limits?.[name], name).toBe(count);
      }
      const gpus = [...pool.gpuResources.keys()].filter((k) => k.endsWith('/gpu'));
      expect(d.spec.template.spec.tolerations.map((t: Obj) => t.key)).toEqual(gpus);
    }
  });

  it('gives every pool a PodDisruptionBudget that selects its pods and lets one node go at a time', () => {
    for (const d of nodeDeployments) {
      const pdbs = ofKind('PodDisruptionBudget').filter((p) =>
        matches(p.spec.selector.matchLabels, d.spec.template.metadata.labels),
      );
      expect(pdbs).toHaveLength(1);
      expect(pdbs[0]!.spec.maxUnavailable).toBe(1);
    }
  });

  it('routes each model named in a request to its InferencePool through the HTTPRoute', () => {
    const route = ofKind('HTTPRoute')[0]!;
    const pools = new Set(ofKind('InferencePool').map((p) => p.metadata.name));
    const routed = route.spec.rules.map((r: Obj) => [r.matches[0].headers[0].value, r.backendRefs[0].name]);
    expect(routed).toEqual(fleetModels(fleet).map((m) => [m, `${fleet.name}-${m.replace(/\./g, '-')}`]));
    expect(routed.every(([, p]: string[]) => pools.has(p!))).toBe(true);
    expect(route.spec.rules.every((r: Obj) => r.matches.length === CLIENT_PATHS.length)).toBe(true);
  });
});

describe('the real-gguf fleet', () => {
  const { fleet, nodeDeployments, byName, ofKind } = loadRendered('real-gguf');

  it('serves every model with llama.cpp on CUDA from a GGUF on a read-only claim', () => {
    const models = fleet.pools.flatMap((p) => p.models);
    expect(models.length).toBeGreaterThan(1);
    for (const m of models) {
      expect(m.engine?.gpu, m.name).toBe('cuda');
      expect(m.engine && 'claim' in m.engine.volume, m.name).toBe(true);
    }
    for (const d of nodeDeployments) {
      const claims = (d.spec.template.spec.volumes as Obj[]).filter((v) => v.persistentVolumeClaim);
      expect(claims).toHaveLength(1);
      const mount = byName(d, 'worker').volumeMounts!.find((v) => v.name === claims[0]!.name)!;
      expect(mount).toMatchObject({ readOnly: true, mountPath: expect.stringMatching(/^\/models\/[a-z0-9-]+$/) });
      const config = parse(
        ofKind('ConfigMap').find((c) => c.metadata.name === `${d.metadata.name}-config`)!.data['config.yaml'],
      ) as Obj;
      expect(config.models[0]).toMatchObject({
        engine: 'llama.cpp',
        gpu: 'cuda',
        file: expect.stringMatching(/\.gguf$/),
      });
      expect(config.models[0].file.startsWith(`${mount.mountPath}/`)).toBe(true);
    }
  });
});

describe('the kustomize overlays', () => {
  it.each(['dev', 'production'])('%s builds on a rendered fleet and patches only objects it has', (overlay) => {
    const dir = join(REPO_ROOT, 'deploy', 'overlays', overlay);
    const k = parse(readFileSync(join(dir, 'kustomization.yaml'), 'utf8')) as Obj;
    const base = join(dir, k.resources[0] as string);
    expect(existsSync(join(base, 'kustomization.yaml'))).toBe(true);
    const baseFiles = (parse(readFileSync(join(base, 'kustomization.yaml'), 'utf8')) as Obj).resources as string[];
    const objects = baseFiles.flatMap((f) => docs(readFileSync(join(base, f), 'utf8')));
    for (const p of k.patches ?? []) {
      expect(objects.some((o) => o['kind'] === p.target.kind && o.metadata.name === p.target.name)).toBe(true);
    }
    const images = objects.flatMap((o) => (o['kind'] === 'Deployment' ? o.spec.template.spec.containers : []));
    for (const i of k.images ?? []) expect(images.some((c: Obj) => c.image.startsWith(`${i.name}:`))).toBe(true);
    const tokenRefs = images.flatMap((c: Obj) => c.env ?? []).map((e: Obj) => e.valueFrom?.secretKeyRef?.name);
    for (const s of k.secretGenerator) {
      expect(tokenRefs).toContain(s.name);
      expect(s.options.disableNameSuffixHash).toBe(true);
      const example = readFileSync(join(dir, 'tokens.env.example'), 'utf8');
      const keys = example.split('\n').filter((l) => /^[a-z]/.test(l));
      expect(keys.map((l) => l.split('=')[0])).toEqual(Object.values(TOKEN_KEYS).map((t) => t.key));
      // Examples only: every value is a placeholder, which serve refuses at start, and the file says so.
      expect(keys.every((l) => l.split('=')[1]!.startsWith('REPLACE-ME'))).toBe(true);
      expect(example).toMatch(/refuse/);
    }
  });
});

describe('the fleet file parser', () => {
  const minimal = (pools: string): string => `name: f\nimage: img:1\npools:\n${pools}`;
  const pool = (name: string, mode: string, models: string): string =>
    minimal(`  - { name: ${name}, mode: ${mode}, nodes: 1, models: [${models}] }\n`);
  const m8b = (name: string, extra = ''): string => `{ name: ${name}, profile: llama-3-8b${extra} }`;
  const m70b = (name: string): string => `{ name: ${name}, profile: llama-3-70b }`;

  it('splits a small pool evenly among models that do not state their replicas', () => {
    const fleet = parseFleet(pool('s', 'small', `${m8b('a')}, ${m8b('b', ', replicas: 5')}`));
    expect(fleet.pools[0]!.models.map((m) => m.replicas)).toEqual([3, 5]);
  });

  it('names the field when a large pool asks for more than one model', () => {
    expect(() => parseFleet(pool('l', 'large', `${m70b('a')}, ${m70b('b')}`))).toThrow(
      new FleetError('pools[0].models', 'a large pool serves one model'),
    );
  });

  it('names the field when small replicas do not fit on eight GPUs', () => {
    expect(() => parseFleet(pool('s', 'small', `${m8b('a', ', replicas: 8')}, ${m8b('b')}`))).toThrow(
      /pools\[0\]\.models: replicas must fit on 8 GPUs/,
    );
  });

  const gguf = (extra: string): string =>
    pool('s', 'small', m8b('a', `, engine: llama.cpp, volume: { claim: weights }, file: a.gguf${extra}`));

  it('reads a llama.cpp model: its volume, file and offload settings, with the serve config defaults', () => {
    const m = parseFleet(gguf(', gpu: cuda, gpuLayers: 20')).pools[0]!.models[0]!;
    expect(m.engine).toEqual({
      volume: { claim: 'weights' },
      file: 'a.gguf',
      gpu: 'cuda',
      gpuLayers: 20,
      threads: 1,
      contextTokens: 512,
      sequences: 4,
    });
    const host = pool('s', 'small', m8b('a', ', engine: llama.cpp, volume: { hostPath: /srv/gguf }, file: x/a.gguf'));
    expect(parseFleet(host).pools[0]!.models[0]!.engine?.volume).toEqual({ hostPath: '/srv/gguf' });
  });

  it.each([
    [', gpu: tpu', 'pools[0].models[0].gpu'],
    [', gpu: metal', 'pools[0].models[0].gpu'],
    [', gpuLayers: -1', 'pools[0].models[0].gpuLayers'],
    [', threads: 0', 'pools[0].models[0].threads'],
    [', sequences: 1000', 'pools[0].models[0].sequences'],
    [', contextTokens: 100', 'pools[0].models[0].contextTokens'],
    [', gpulayers: 3', 'pools[0].models[0].gpulayers'],
  ])('refuses a bad offload setting (%s), naming the field', (extra, field) => {
    expect(() => parseFleet(gguf(extra))).toThrow(FleetError);
    expect(() => parseFleet(gguf(extra))).toThrow(`${field}: `);
  });

  it.each([
    ['engine: llama.cpp, volume: { claim: weights }, file: ../etc/a.gguf', 'pools[0].models[0].file'],
    ['engine: llama.cpp, volume: { claim: weights }, file: /abs/a.gguf', 'pools[0].models[0].file'],
    ['engine: llama.cpp, volume: { claim: weights }, file: "x\\n/../../../etc/a.gguf"', 'pools[0].models[0].file'],
    ['engine: llama.cpp, volume: { claim: weights }, file: a//b.gguf', 'pools[0].models[0].file'],
    ['engine: llama.cpp, volume: { claim: weights }, file: a/./b.gguf', 'pools[0].models[0].file'],
    ['engine: llama.cpp, volume: { claim: weights }, file: a.bin', 'pools[0].models[0].file'],
    ['engine: llama.cpp, volume: { claim: weights }', 'pools[0].models[0].file'],
    ['engine: llama.cpp, file: a.gguf', 'pools[0].models[0].volume'],
    ['engine: llama.cpp, volume: { claim: w, hostPath: /x }, file: a.gguf', 'pools[0].models[0].volume'],
    ['engine: llama.cpp, volume: { hostPath: srv }, file: a.gguf', 'pools[0].models[0].volume.hostPath'],
    ['engine: llama.cpp, volume: { hostPath: /srv/../etc }, file: a.gguf', 'pools[0].models[0].volume.hostPath'],
    ['engine: llama.cpp, volume: { claim: Bad_Claim }, file: a.gguf', 'pools[0].models[0].volume.claim'],
    ['engine: vllm', 'pools[0].models[0].engine'],
    ['file: a.gguf', 'pools[0].models[0].file'],
    ['gpu: cuda', 'pools[0].models[0].gpu'],
  ])('refuses a bad model volume or file (%s), naming the field', (extra, field) => {
    expect(() => parseFleet(pool('s', 'small', m8b('a', `, ${extra}`)))).toThrow(`${field}: `);
  });

  it('refuses at render what the serve config refuses (a context not a multiple of 256), naming the fleet field', () => {
    const fleet = parseFleet(gguf(', contextTokens: 4000'));
    expect(() => renderFleet(fleet, 'f.yaml')).toThrow(/^pools\[0\]\.models\[0\]\.contextTokens: .*multiple of 256/);
  });

  it("reads GPU resources per pool: the node's eight GPUs once, other extended resources alongside", () => {
    const withGpus = (r: string): string =>
      minimal(`  - { name: s, mode: small, nodes: 1, gpuResources: ${r}, models: [${m8b('a')}] }\n`);
    const amd = parseFleet(withGpus('{ amd.com/gpu: 8, rdma/hca: 1 }')).pools[0]!;
    expect([...amd.gpuResources]).toEqual([
      ['amd.com/gpu', 8],
      ['rdma/hca', 1],
    ]);
    expect(
      parseFleet(minimal(`  - { name: s, mode: small, nodes: 1, models: [${m8b('a')}] }\n`)).pools[0]!.gpuResources,
    ).toEqual(new Map([['nvidia.com/gpu', 8]]));
    expect(() => parseFleet(withGpus('{ nvidia.com/gpu: 4 }'))).toThrow(/^pools\[0\]\.gpuResources: /);
    expect(() => parseFleet(withGpus('{ rdma/hca: 1 }'))).toThrow(/^pools\[0\]\.gpuResources: /);
    expect(() => parseFleet(withGpus('{ gpu: 8 }'))).toThrow(/^pools\[0\]\.gpuResources\.gpu: /);
    expect(() => parseFleet(withGpus('{ nvidia.com/gpu: 8, rdma/hca: 0 }'))).toThrow(/gpuResources\.rdma\/hca: /);
  });

  it('keeps class names as keys of a Map (toString is a class), and refuses at render what serve refuses', () => {
    const fleet = parseFleet(pool('s', 'small', m8b('a', ', classes: { toString: { ttftMs: 500 } }')));
    const classes = fleet.pools[0]!.models[0]!.classes!;
    expect([...classes.keys()]).toEqual(['toString']);
    expect(classes.get('toString')?.get('ttftMs')).toBe(500);
    const cm = renderFleet(fleet, 'f.yaml').find((f) => f.path.endsWith('pool-s.yaml'))!;
    const config = parse(docs(cm.text)[0]!.data['config.yaml'] as string) as Obj;
    expect(normalizeScenario(config).models[0]!.classes.map((c) => [c.name, c.ttftMs])).toEqual([['toString', 500]]);
    const reserved = parseFleet(pool('s', 'small', m8b('a', ', classes: { constructor: { ttftMs: 500 } }')));
    expect(() => renderFleet(reserved, 'f.yaml')).toThrow(/^pools\[0\]\.models\[0\]\.classes\.constructor: /);
  });

  it('refuses a pool name that is not a DNS label', () => {
    expect(() => parseFleet(pool('Big_Pool', 'large', m70b('a')))).toThrow(/pools\[0\]\.name/);
  });
});

describe('the structural checks of custom resources', () => {
  const rendered = join(REPO_ROOT, 'deploy', 'rendered', 'mixed-2x2', MANIFESTS_DIR);
  const first = (file: string, kind: string): Obj =>
    docs(readFileSync(join(rendered, file), 'utf8')).find((o) => o['kind'] === kind)!;

  it('catch an InferencePool without a selector, with duplicate ports, or without an EPP port', () => {
    const pool = first('model-llama-3-8b.yaml', 'InferencePool');
    expect(checkInferencePool({ ...pool, spec: { ...pool.spec, selector: { matchLabels: {} } } })).not.toEqual([]);
    expect(
      checkInferencePool({ ...pool, spec: { ...pool.spec, targetPorts: [{ number: 1 }, { number: 1 }] } }),
    ).not.toEqual([]);
    const ref = { ...pool.spec.endpointPickerRef, port: undefined };
    expect(checkInferencePool({ ...pool, spec: { ...pool.spec, endpointPickerRef: ref } })).not.toEqual([]);
  });

  it('catch an HTTPRoute rule with a relative path or no backend, and a PodMonitor with a bad interval', () => {
    const route = first('http-route.yaml', 'HTTPRoute');
    const rule = route.spec.rules[0];
    const badPath = { ...rule, matches: [{ path: { type: 'PathPrefix', value: 'v1' } }] };
    expect(checkHTTPRoute({ ...route, spec: { ...route.spec, rules: [badPath] } })).not.toEqual([]);
    expect(checkHTTPRoute({ ...route, spec: { ...route.spec, rules: [{ ...rule, backendRefs: [] }] } })).not.toEqual(
      [],
    );
    const monitor = first('pod-monitor.yaml', 'PodMonitor');
    const endpoints = [{ ...monitor.spec.podMetricsEndpoints[0], interval: 'often' }];
    expect(checkPodMonitor({ ...monitor, spec: { ...monitor.spec, podMetricsEndpoints: endpoints } })).not.toEqual([]);
  });

  it('and the kubernetes-models schema catches a Deployment with a mistyped replica count', () => {
    const d = first('pool-large.yaml', 'Deployment');
    expect(() => new Deployment({ ...d, spec: { ...d.spec, replicas: 'two' } } as never).validate()).toThrow(
      /replicas/,
    );
  });
});
