#!/usr/bin/env node
// The architecture's rules: which top-level folder of src/ may import which, no import cycle anywhere
// (type-only imports count), one error model (no plain `class … extends Error`: errors are tagged),
// no file of src/control/ over 500 lines, and docs/architecture.md names only paths that exist. Run by `npm run lint`.
import { readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..")
const src = join(root, "src")

/**
 * What each folder of src/ may import from the others (itself always). The ground floor is what several
 * components share: error tags and their statuses, configuration, the control-plane/node wire contract,
 * process plumbing, metric and trace primitives, and the SDK (`app-runtime`, whose schemas are the
 * apps' contract; it imports nothing outside itself, since an app's process may read nothing else).
 * Above it the components, each importing the ground floor and those listed; `control` and `cli` on top.
 */
const ground = ["errors", "config", "contracts", "process", "metrics", "tracing", "app-runtime"]
const groundFloor = (...others) => [...ground, ...others]
export const allowed = {
  "app-runtime": [],
  errors: [],
  config: [],
  metrics: [],
  contracts: ["errors", "config"],
  tracing: ["errors", "config"],
  process: ["errors", "config", "metrics", "tracing"],
  models: groundFloor(),
  sidecar: groundFloor(),
  executors: groundFloor("models", "sidecar"),
  node: groundFloor("models", "sidecar", "executors"),
  control: groundFloor("models", "sidecar", "executors", "node"),
  cli: groundFloor("models", "sidecar", "executors", "node", "control")
}

const walk = (dir) =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? walk(path) : /\.(ts|mts)$/.test(name) ? [path] : []
  })

const importPattern =
  /(?:^|[\s;])(?:import|export)\s+(?:type\s+)?(?:[^"';]*?\s+from\s+)?["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g

const resolveImport = (from, spec) => {
  if (!spec.startsWith(".")) return undefined
  const base = resolve(dirname(from), spec)
  for (const candidate of [
    base.replace(/\.js$/, ".ts"),
    base.replace(/\.mjs$/, ".mts"),
    `${base}.ts`,
    join(base, "index.ts")
  ]) {
    try {
      if (statSync(candidate).isFile()) return candidate
    } catch {}
  }
  return base
}

export const importGraph = () => {
  const graph = new Map()
  for (const file of walk(src)) {
    const text = readFileSync(file, "utf8")
      .replace(/\/\*[\s\S]*?\*\//g, "")
      .replace(/^\s*\/\/.*$/gm, "")
    const targets = new Set()
    for (const match of text.matchAll(importPattern)) {
      const target = resolveImport(file, match[1] ?? match[2])
      if (target !== undefined) targets.add(target)
    }
    graph.set(file, [...targets])
  }
  return graph
}

const folderOf = (file) => relative(src, file).split("/")[0]
const name = (file) => relative(root, file)

export const layerViolations = (graph) => {
  const found = []
  for (const [file, targets] of graph) {
    const from = folderOf(file)
    for (const target of targets) {
      const to = folderOf(target)
      if (to === from || from.endsWith(".ts")) continue
      const rule = allowed[from]
      if (rule === undefined) found.push(`${name(file)}: folder src/${from} has no layering rule`)
      else if (!rule.includes(to))
        found.push(`${name(file)} imports ${name(target)}: src/${from} may not import src/${to}`)
    }
  }
  return found
}

/** Every strongly connected component of more than one file (or a file importing itself), as a cycle. */
export const importCycles = (graph) => {
  let index = 0
  const indices = new Map()
  const lowlinks = new Map()
  const stack = []
  const onStack = new Set()
  const cycles = []
  const visit = (node) => {
    indices.set(node, index)
    lowlinks.set(node, index)
    index++
    stack.push(node)
    onStack.add(node)
    for (const next of graph.get(node) ?? []) {
      if (!graph.has(next)) continue
      if (!indices.has(next)) {
        visit(next)
        lowlinks.set(node, Math.min(lowlinks.get(node), lowlinks.get(next)))
      } else if (onStack.has(next)) lowlinks.set(node, Math.min(lowlinks.get(node), indices.get(next)))
    }
    if (lowlinks.get(node) === indices.get(node)) {
      const component = []
      let member
      do {
        member = stack.pop()
        onStack.delete(member)
        component.push(member)
      } while (member !== node)
      if (component.length > 1 || (graph.get(node) ?? []).includes(node)) cycles.push(component.map(name).sort())
    }
  }
  for (const node of graph.keys()) if (!indices.has(node)) visit(node)
  return cycles
}

/**
 * The graph between the component folders inside `control/` (gateway, app-manager, dispatcher, ...):
 * a file directly in `control/` is its own node. The components must not import each other in a circle either.
 */
export const controlFolderGraph = (graph) => {
  const control = join(src, "control")
  const unit = (file) => {
    const parts = relative(control, file).split("/")
    return join(control, parts.length > 1 ? parts[0] : parts[0])
  }
  const folders = new Map()
  for (const [file, targets] of graph) {
    if (!file.startsWith(`${control}/`)) continue
    const from = unit(file)
    const edges = folders.get(from) ?? new Set()
    for (const target of targets) if (target.startsWith(`${control}/`) && unit(target) !== from) edges.add(unit(target))
    folders.set(from, edges)
  }
  return new Map([...folders].map(([folder, edges]) => [folder, [...edges]]))
}

/** The paths docs/architecture.md names (in backticks) that do not exist in the repository. */
export const missingDocumentedPaths = () => {
  const doc = join(root, "docs", "architecture.md")
  const named = [
    ...readFileSync(doc, "utf8").matchAll(/`((?:src|bench|test|scripts|docs|examples|deploy|bin)\/[^`\s]*)`/g)
  ]
  return [...new Set(named.map((match) => match[1]))].filter((path) => {
    try {
      statSync(join(root, path))
      return false
    } catch {
      return true
    }
  })
}

/** Files of src/ that declare an error class outside the tagged model (`Data.TaggedError`, `Schema.TaggedError`). */
export const plainErrorClasses = (graph) =>
  [...graph.keys()].flatMap((file) =>
    [
      ...readFileSync(file, "utf8").matchAll(/^\s*(?:export\s+)?class\s+(\w+)\s+extends\s+(?:Type|Range)?Error\b/gm)
    ].map(
      (match) =>
        `${relative(root, file)}: class ${match[1]} extends a plain Error; errors are tagged (Data.TaggedError, Schema.TaggedError)`
    )
  )

/** A file of the control plane holds one concept: past this many lines it holds several, and is split. */
export const maxControlLines = 500

/** Files of src/control/ longer than `maxControlLines`. */
export const longControlFiles = (graph) =>
  [...graph.keys()]
    .filter((file) => file.startsWith(`${join(src, "control")}/`))
    .flatMap((file) => {
      const lines = readFileSync(file, "utf8").split("\n").length - 1
      return lines > maxControlLines
        ? [`${relative(root, file)}: ${lines} lines, over ${maxControlLines}; split it by concept`]
        : []
    })

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const graph = importGraph()
  const violations = [
    ...layerViolations(graph),
    ...plainErrorClasses(graph),
    ...longControlFiles(graph),
    ...missingDocumentedPaths().map((path) => `docs/architecture.md names ${path}, which does not exist`)
  ]
  const cycles = [...importCycles(graph), ...importCycles(controlFolderGraph(graph))]
  for (const line of violations) console.error(line)
  for (const cycle of cycles) console.error(`import cycle: ${cycle.join(" <-> ")}`)
  if (violations.length + cycles.length > 0) process.exit(1)
  console.log(
    `architecture: ${graph.size} files in src/ follow the layering with no import cycle, no plain error class and no control file over ${maxControlLines} lines; docs/architecture.md names only paths that exist`
  )
}
