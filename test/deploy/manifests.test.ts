import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { stripVTControlCharacters } from "node:util"
import { DaemonSet, Deployment } from "kubernetes-models/apps/v1"
import {
  type IContainer,
  type IContainerPort,
  type IPodSpec,
  type IProbe,
  PersistentVolumeClaim,
  Service
} from "kubernetes-models/v1"
import { beforeAll, describe, expect, it } from "vitest"
import { parseAllDocuments } from "yaml"
import { repoRoot, runCli } from "../support/platform.js"

const manifestDir = join(repoRoot, "deploy", "kubernetes")
const version: string = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")).version

type KubernetesObject = Deployment | DaemonSet | Service | PersistentVolumeClaim

/** Every kind the manifests may hold, with the model that knows its schema. */
const models: Record<string, (data: never) => KubernetesObject> = {
  "apps/v1/Deployment": (data) => new Deployment(data),
  "apps/v1/DaemonSet": (data) => new DaemonSet(data),
  "v1/Service": (data) => new Service(data),
  "v1/PersistentVolumeClaim": (data) => new PersistentVolumeClaim(data)
}

/**
 * The schema validators read every property the schema knows and no other, so a property the
 * validation never read is one Kubernetes does not know (a misspelt field would otherwise pass).
 */
const unknownFields = (object: KubernetesObject): ReadonlyArray<string> => {
  const read = new Set<string>()
  const tracked = (value: unknown, path: string): unknown =>
    value === null || typeof value !== "object"
      ? value
      : new Proxy(value, {
          get(target, key, receiver) {
            const child = Reflect.get(target, key, receiver)
            if (typeof key !== "string" || !Object.hasOwn(target, key)) return child
            read.add(`${path}/${key}`)
            return tracked(child, `${path}/${key}`)
          }
        })
  object.validate.call(tracked(object, "") as KubernetesObject)
  const unknown: Array<string> = []
  const walk = (value: unknown, path: string) => {
    if (value === null || typeof value !== "object") return
    for (const [key, child] of Object.entries(value)) {
      if (!read.has(`${path}/${key}`)) unknown.push(`${path}/${key}`)
      else walk(child, `${path}/${key}`)
    }
  }
  walk(object, "")
  return unknown
}

interface Manifest {
  readonly file: string
  readonly object: KubernetesObject
}

const loadManifests = (): ReadonlyArray<Manifest> =>
  readdirSync(manifestDir)
    .filter((file) => file.endsWith(".yaml") || file.endsWith(".yml"))
    .sort()
    .flatMap((file) =>
      parseAllDocuments(readFileSync(join(manifestDir, file), "utf8")).map((document) => {
        if (document.errors.length > 0) throw new Error(`${file}: ${document.errors[0]!.message}`)
        const data = document.toJS() as { apiVersion?: string; kind?: string }
        const model = models[`${data.apiVersion}/${data.kind}`]
        if (model === undefined) throw new Error(`${file}: no schema for ${data.apiVersion} ${data.kind}`)
        return { file, object: model(data as never) }
      })
    )

/** One `cornserve serve` option, as its --help describes it. */
interface FlagSpec {
  readonly names: ReadonlyArray<string>
  /** undefined for a switch that takes no value. */
  readonly type: "text" | "integer" | "float" | "directory" | ReadonlyArray<string> | undefined
  readonly repeatable: boolean
}

/** The options section of `cornserve serve --help`: a heading per option, its description indented. */
const parseHelp = (help: string): ReadonlyArray<FlagSpec> =>
  stripVTControlCharacters(help)
    .split("\n")
    .filter((line) => /^\(?--/.test(line))
    .map((line) => {
      const heading = line.replace(/^\((.*)\)$/, "$1")
      const names = [...heading.matchAll(/--[a-z][a-z-]*/g)].map((match) => match[0])
      const rest = heading.slice(heading.lastIndexOf(names.at(-1)!) + names.at(-1)!.length).trim()
      const repeatable = rest.endsWith("...")
      const type = rest.replace(/\.\.\.$/, "")
      return {
        names,
        repeatable,
        type:
          type === ""
            ? undefined
            : type === "text" || type === "integer" || type === "float" || type === "directory"
              ? type
              : type.split(" | ")
      }
    })

let helpFlags: Promise<ReadonlyArray<FlagSpec>> | undefined

/** `cornserve serve --help`'s options, read once for the file. */
const serveFlagSpecs = (): Promise<ReadonlyArray<FlagSpec>> => {
  helpFlags ??= runCli(["serve", "--help"]).then((help) => {
    expect(help.code).toBe(0)
    return parseHelp(help.stdout)
  })
  return helpFlags
}

type ServeFlags = ReadonlyMap<string, ReadonlyArray<string>>

/** Reads a container's args as `cornserve serve` would, keyed by each option's first name. */
const parseServeArgs = (args: ReadonlyArray<string>, specs: ReadonlyArray<FlagSpec>): ServeFlags => {
  expect(args[0], "the first argument is the serve command").toBe("serve")
  const flags = new Map<string, Array<string>>()
  for (let index = 1; index < args.length; index++) {
    const token = args[index]!
    expect(token, `argument ${index} is an option`).toMatch(/^--/)
    const [name, inline] = token.includes("=")
      ? [token.slice(0, token.indexOf("=")), token.slice(token.indexOf("=") + 1)]
      : [token, undefined]
    const spec = specs.find((candidate) => candidate.names.includes(name!))
    expect(spec, `cornserve serve --help lists ${name}`).toBeDefined()
    const values = flags.get(spec!.names[0]!) ?? []
    expect(values.length === 0 || spec!.repeatable, `${name} is given once`).toBe(true)
    if (spec!.type === undefined) {
      values.push(inline ?? "true")
    } else {
      const value = inline ?? args[++index]
      expect(value, `${name} has a value`).toBeDefined()
      if (spec!.type === "integer") expect(value, `${name} is an integer`).toMatch(/^-?\d+$/)
      else if (spec!.type === "float") expect(Number.isFinite(Number(value)), `${name} is a number`).toBe(true)
      else if (Array.isArray(spec!.type)) expect(spec!.type, `${name}'s choices`).toContain(value)
      values.push(value!)
    }
    flags.set(spec!.names[0]!, values)
  }
  return flags
}

const single = (flags: ServeFlags, name: string): string | undefined => flags.get(name)?.[0]

/** A Kubernetes quantity ("3Gi", "512M", "1073741824") in bytes. */
const quantityBytes = (quantity: string | number): number => {
  const match = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(quantity))
  if (match === null) throw new Error(`not a quantity: ${quantity}`)
  const unit = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 }
  return Number(match[1]) * (match[2] === undefined ? 1 : unit[match[2] as keyof typeof unit])
}

interface Workload {
  readonly name: string
  readonly spec: IPodSpec
  readonly container: IContainer
  readonly flags: ServeFlags
}

const containerPort = (container: IContainer, port: string | number): IContainerPort | undefined =>
  container.ports?.find((candidate) =>
    typeof port === "number" ? candidate.containerPort === port : candidate.name === port
  )

const probePort = (probe: IProbe | undefined): string | number | undefined =>
  probe?.httpGet?.port ?? probe?.tcpSocket?.port

/** The ports `cornserve serve` listens on with these flags (defaults as in --help's descriptions). */
const listeningPorts = (flags: ServeFlags): ReadonlyArray<number> => [
  Number(single(flags, "--port") ?? 8000),
  ...(single(flags, "--role") === "control-plane" ? [Number(single(flags, "--cluster-port") ?? 8001)] : [])
]

/** `Host`'s names that `serve` treats as reachable only from this machine. */
const isLoopback = (host: string) => host === "localhost" || host === "::1" || host.startsWith("127.")

const manifests = loadManifests()

describe("deploy/kubernetes", () => {
  let specs: ReadonlyArray<FlagSpec> = []
  const workloads = (): ReadonlyArray<Workload> =>
    manifests.flatMap(({ object }) => {
      if (!(object instanceof Deployment || object instanceof DaemonSet)) return []
      const spec = object.spec!.template.spec!
      expect(spec.containers, `${object.metadata?.name} runs one container`).toHaveLength(1)
      const container = spec.containers[0]!
      return [{ name: object.metadata!.name!, spec, container, flags: parseServeArgs(container.args ?? [], specs) }]
    })
  const workload = (role: string): Workload => {
    const found = workloads().filter((candidate) => single(candidate.flags, "--role") === role)
    expect(found, `one workload runs --role ${role}`).toHaveLength(1)
    return found[0]!
  }
  const controlPlaneService = (): Service => {
    const controlPlane = manifests.find(({ object }) => object instanceof Deployment)!.object as Deployment
    const labels = controlPlane.spec!.template.metadata!.labels!
    const services = manifests
      .map(({ object }) => object)
      .filter((object): object is Service => object instanceof Service)
      .filter((service) => Object.entries(service.spec!.selector ?? {}).every(([key, value]) => labels[key] === value))
    expect(services, "one Service selects the control plane's pods").toHaveLength(1)
    return services[0]!
  }

  beforeAll(async () => {
    specs = await serveFlagSpecs()
    expect(specs.map((spec) => spec.names[0])).toContain("--role")
  })

  it("holds the control plane's Deployment, its Service and state claim, and the data plane's DaemonSet", () => {
    expect(manifests.map(({ object }) => object.kind).sort()).toEqual([
      "DaemonSet",
      "Deployment",
      "PersistentVolumeClaim",
      "Service"
    ])
  })

  it("validates every manifest against the Kubernetes schemas, with no field the schemas do not know", () => {
    for (const { file, object } of manifests) {
      expect(() => object.validate(), file).not.toThrow()
      expect(unknownFields(object), file).toEqual([])
    }
  })

  it("runs every workload with flags `cornserve serve --help` lists, and the image of this version", () => {
    const found = workloads()
    expect(found.map((candidate) => single(candidate.flags, "--role")).sort()).toEqual(["control-plane", "data-plane"])
    for (const { name, container, flags } of found) {
      expect(container.image, name).toBe(`cornserve:${version}`)
      expect(container.command, `${name} keeps the image's entry point`).toBeUndefined()
      const host = single(flags, "--host") ?? "127.0.0.1"
      if (!isLoopback(host) && !flags.has("--insecure-no-auth")) {
        const admin = container.env?.find((variable) => variable.name === "CORNSERVE_ADMIN_TOKEN")
        expect(admin?.valueFrom?.secretKeyRef, `${name} listens on ${host}: it needs the admin token`).toBeDefined()
      }
    }
  })

  it("fills every $(VAR) in the args from the container's environment", () => {
    for (const { name, container } of workloads()) {
      const declared = new Set(container.env?.map((variable) => variable.name))
      for (const reference of (container.args ?? []).flatMap((arg) => [...arg.matchAll(/\$\(([A-Za-z_]\w*)\)/g)])) {
        expect(declared.has(reference[1]!), `${name} declares ${reference[1]}`).toBe(true)
      }
    }
  })

  it("gives both planes the same cluster token from a Secret", () => {
    const tokens = workloads().map(
      ({ container }) =>
        container.env?.find((variable) => variable.name === "CORNSERVE_CLUSTER_TOKEN")?.valueFrom?.secretKeyRef
    )
    expect(tokens[0]).toBeDefined()
    expect(tokens[0]?.optional).not.toBe(true)
    expect(tokens[1]).toEqual(tokens[0])
  })

  it("declares and probes the ports each workload's flags make it listen on", () => {
    for (const { name, container, flags } of workloads()) {
      const ports = listeningPorts(flags)
      expect(container.ports?.map((port) => port.containerPort).sort(), name).toEqual([...ports].sort())
      for (const [probe, readiness] of [
        [container.readinessProbe, true],
        [container.livenessProbe, false]
      ] as const) {
        expect(probe, `${name} has readiness and liveness probes`).toBeDefined()
        const port = containerPort(container, probePort(probe)!)
        expect(port?.containerPort, `${name}'s probe targets --port`).toBe(Number(single(flags, "--port") ?? 8000))
        // The gateway's /ready waits for the restored apps; a data-plane node has /health only.
        const path = readiness && single(flags, "--role") !== "data-plane" ? "/ready" : "/health"
        if (probe!.httpGet !== undefined) expect(probe!.httpGet.path).toBe(path)
      }
    }
  })

  it("probes the control plane's /ready and /health on its gateway port, and exposes the gateway and cluster ports", () => {
    const { container, flags } = workload("control-plane")
    expect(container.readinessProbe?.httpGet?.path).toBe("/ready")
    expect(container.livenessProbe?.httpGet?.path).toBe("/health")
    for (const probe of [container.readinessProbe!, container.livenessProbe!]) {
      expect(containerPort(container, probe.httpGet!.port)?.containerPort).toBe(Number(single(flags, "--port")))
    }
    const service = controlPlaneService()
    const targets = service.spec!.ports!.map((port) => containerPort(container, port.targetPort ?? port.port))
    expect(targets.map((port) => port?.containerPort).sort()).toEqual(
      [Number(single(flags, "--port")), Number(single(flags, "--cluster-port"))].sort()
    )
    expect(flags.get("--allowed-host"), "admin requests by the Service's name pass").toContain(service.metadata!.name)
  })

  it("keeps the control plane's state on its claim, with one pod that lets go of it before the next starts", () => {
    const { spec, container, flags } = workload("control-plane")
    const deployment = manifests.find(({ object }) => object instanceof Deployment)!.object as Deployment
    expect(deployment.spec!.replicas).toBe(1)
    expect(deployment.spec!.strategy?.type).toBe("Recreate")
    const mount = container.volumeMounts?.find((candidate) => candidate.mountPath === single(flags, "--state-dir"))
    expect(mount, "--state-dir is a mounted volume").toBeDefined()
    const claimName = spec.volumes?.find((volume) => volume.name === mount!.name)?.persistentVolumeClaim?.claimName
    const claim = manifests.find(
      ({ object }) => object instanceof PersistentVolumeClaim && object.metadata?.name === claimName
    )
    expect(claim, "the state volume's claim is among the manifests").toBeDefined()
  })

  it("joins each data-plane node to the Service's cluster port, named after its Kubernetes node", () => {
    const { container, flags } = workload("data-plane")
    const controlPlane = workload("control-plane")
    const service = controlPlaneService()
    const join = new URL(single(flags, "--join")!)
    expect(join.protocol).toBe("http:")
    expect(join.hostname).toBe(service.metadata!.name)
    const servicePort = service.spec!.ports!.find((port) => port.port === Number(join.port))
    expect(servicePort, "--join names a port of the Service").toBeDefined()
    expect(containerPort(controlPlane.container, servicePort!.targetPort!)?.containerPort).toBe(
      Number(single(controlPlane.flags, "--cluster-port"))
    )
    const fieldOf = (arg: string | undefined) =>
      container.env?.find((variable) => `$(${variable.name})` === arg)?.valueFrom?.fieldRef?.fieldPath
    expect(fieldOf(single(flags, "--node-name"))).toBe("spec.nodeName")
    expect(fieldOf(single(flags, "--advertise-host"))).toBe("status.podIP")
  })

  it("gives each data-plane node a memory-backed /dev/shm larger than its sidecar's arena", () => {
    const { spec, container, flags } = workload("data-plane")
    const arenaBytes = Number(single(flags, "--sidecar-arena-bytes"))
    expect(arenaBytes, "--sidecar-arena-bytes is set, so the volume can be sized for it").toBeGreaterThan(0)
    const mount = container.volumeMounts?.find((candidate) => candidate.mountPath === "/dev/shm")
    const shm = spec.volumes?.find((volume) => volume.name === mount?.name)?.emptyDir
    expect(shm?.medium).toBe("Memory")
    expect(quantityBytes(shm!.sizeLimit!)).toBeGreaterThan(arenaBytes)
    expect(quantityBytes(container.resources!.limits!.memory!)).toBeGreaterThan(quantityBytes(shm!.sizeLimit!))
  })
})

/** The Dockerfile's instructions of its last (runtime) stage, continuation lines joined. */
const runtimeStage = (dockerfile: string): ReadonlyArray<{ readonly keyword: string; readonly rest: string }> => {
  const instructions = dockerfile
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line.length > 0 && !line.startsWith("#"))
    .map((line) => {
      const [keyword, ...rest] = line.split(/\s+/)
      return { keyword: keyword!.toUpperCase(), rest: rest.join(" ") }
    })
  const lastFrom = instructions.findLastIndex((instruction) => instruction.keyword === "FROM")
  return instructions.slice(lastFrom)
}

describe("Dockerfile", () => {
  const dockerfile = readFileSync(join(repoRoot, "Dockerfile"), "utf8")
  const stage = runtimeStage(dockerfile)
  const last = (keyword: string) => stage.findLast((instruction) => instruction.keyword === keyword)?.rest

  it("starts cornserve (under an init that forwards signals) as a user that is not root", () => {
    const entrypoint: ReadonlyArray<string> = JSON.parse(last("ENTRYPOINT")!)
    const program = entrypoint.includes("--") ? entrypoint.slice(entrypoint.indexOf("--") + 1) : entrypoint
    expect(program).toEqual(["cornserve"])
    const user = last("USER")!.split(":")[0]!
    expect(user).not.toBe("root")
    expect(user).not.toBe("0")
    for (const { file, object } of manifests) {
      if (!(object instanceof Deployment || object instanceof DaemonSet)) continue
      const pod = object.spec!.template.spec!.securityContext
      expect(pod?.runAsNonRoot, file).toBe(true)
      expect(String(pod?.runAsUser), `${file} runs as the image's user`).toBe(user)
    }
  })

  it("puts bin/cornserve on the PATH and exposes the ports the manifests use", () => {
    expect(stage.some((instruction) => instruction.keyword === "COPY" && instruction.rest === "bin ./bin")).toBe(true)
    expect(last("WORKDIR")).toBe("/app")
    const env = stage.filter((instruction) => instruction.keyword === "ENV").map((instruction) => instruction.rest)
    expect(env.some((rest) => /\bPATH=\/app\/bin:/.test(rest))).toBe(true)
    expect(last("EXPOSE")?.split(" ")).toEqual(["8000", "8001"])
  })

  it("copies nothing from the build context that .dockerignore leaves out", () => {
    const ignored = readFileSync(join(repoRoot, ".dockerignore"), "utf8")
      .split("\n")
      .map((line) => line.trim())
      .filter((line) => line.length > 0 && !line.startsWith("#"))
    const sources = dockerfile
      .split("\n")
      .filter((line) => /^COPY\s/.test(line) && !line.includes("--from="))
      .flatMap((line) => line.trim().split(/\s+/).slice(1, -1))
    expect(sources.length).toBeGreaterThan(0)
    for (const source of sources) expect(ignored, source).not.toContain(source)
  })
})

/** The docs' "Running a cluster" page (`docs/cluster.md`), its shell lines with continuations joined. */
const clusterSection = (): ReadonlyArray<string> =>
  readFileSync(join(repoRoot, "docs", "cluster.md"), "utf8")
    .replace(/\\\n\s*/g, "")
    .split("\n")

describe('docs: "Running a cluster"', () => {
  let specs: ReadonlyArray<FlagSpec> = []
  beforeAll(async () => {
    specs = await serveFlagSpecs()
  })

  it("starts a control plane and two data-plane nodes that join its cluster port under their own names and ports", () => {
    const nodes = clusterSection()
      .filter((line) => line.startsWith("node bin/cornserve serve "))
      .map((line) => parseServeArgs(line.replace(/\s*&$/, "").split(/\s+/).slice(2), specs))
    expect(nodes.map((flags) => single(flags, "--role"))).toEqual(["control-plane", "data-plane", "data-plane"])
    const [controlPlane, ...dataPlanes] = nodes
    const clusterPort = single(controlPlane!, "--cluster-port") ?? "8001"
    for (const flags of dataPlanes) {
      expect(new URL(single(flags, "--join")!).port).toBe(clusterPort)
    }
    expect(new Set(dataPlanes.map((flags) => single(flags, "--node-name"))).size).toBe(dataPlanes.length)
    const ports = nodes.map((flags) => single(flags, "--port") ?? "8000")
    expect(new Set([...ports, clusterPort]).size).toBe(ports.length + 1)
  })

  it("creates the Secret, with every key the manifests require", () => {
    const create = clusterSection().find((line) => line.startsWith("kubectl create secret generic "))
    expect(create).toBeDefined()
    const [name] = create!.slice("kubectl create secret generic ".length).split(/\s+/)
    const keys = [...create!.matchAll(/--from-literal=([\w-]+)=/g)].map((match) => match[1])
    const required = manifests
      .flatMap(({ object }) =>
        object instanceof Deployment || object instanceof DaemonSet ? object.spec!.template.spec!.containers : []
      )
      .flatMap((container) => container.env ?? [])
      .flatMap((variable) => (variable.valueFrom?.secretKeyRef === undefined ? [] : [variable.valueFrom.secretKeyRef]))
      .filter((reference) => reference.optional !== true)
    expect(required.length).toBeGreaterThan(0)
    for (const reference of required) {
      expect(reference.name).toBe(name)
      expect(keys).toContain(reference.key)
    }
  })
})
