import { type ChildProcess, spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { delimiter, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type LockRegistry, startLockRegistry } from "../support/lockRegistry.js"
import { eventually, invoke, repoRoot } from "../support/platform.js"
import { groupMembers } from "../support/executors.js"
import { trackGroup, trackPath } from "../support/reaper/registry.js"

/** An install of the package's dependencies from npm's cache, two at once, on a busy two-core machine. */
const installLimitMs = 300_000
/** `serve --examples` registering the twelve examples (their executors start on their first call). */
const readyLimitMs = 180_000

const manifest = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as {
  readonly version: string
  readonly dependencies: Readonly<Record<string, string>>
}
const examples = readdirSync(join(repoRoot, "examples")).filter((file) => file.endsWith(".ts"))

interface Result {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/**
 * npm's environment: none of the settings an `npm test` around this run hands its children (its
 * project's prefix among them), where npm's cache and config files are kept; no download of ONNX
 * Runtime's CUDA provider (the project's own install denies that script too) and no analytics.
 */
const npmEnv = (extra: Readonly<Record<string, string>> = {}): NodeJS.ProcessEnv => ({
  ...Object.fromEntries(
    Object.entries(process.env).filter(
      ([name]) =>
        !name.toLowerCase().startsWith("npm_") ||
        ["npm_config_cache", "npm_config_userconfig", "npm_config_globalconfig"].includes(name.toLowerCase())
    )
  ),
  ONNXRUNTIME_NODE_INSTALL: "skip",
  SCARF_ANALYTICS: "false",
  ...extra
})

/** Runs a command to its end in a process group of its own, which the test run's reaper ends if this worker goes. */
const run = (command: string, args: ReadonlyArray<string>, cwd: string, env = npmEnv(), timeoutMs = 60_000) =>
  new Promise<Result>((resolve) => {
    const child = spawn(command, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"], detached: true })
    trackGroup(child)
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    const timer = setTimeout(() => process.kill(-child.pid!, "SIGKILL"), timeoutMs)
    child.once("close", (code) => {
      clearTimeout(timer)
      resolve({ code: code ?? 1, stdout, stderr })
    })
  })

/** The files a pack's JSON report lists. */
const packedFiles = (report: string): Array<string> => {
  const [pack] = JSON.parse(report) as Array<{ files: Array<{ path: string }> }>
  return pack!.files.map((file) => file.path)
}

const expectShippable = (files: ReadonlyArray<string>) => {
  expect(files).toEqual(
    expect.arrayContaining([
      "package.json",
      "bin/cornserve",
      "dist/bundle/cli.js",
      "dist/bundle/executor-roles.js",
      "dist/app-runtime/index.js",
      "dist/app-runtime/index.d.ts",
      "dist/app-runtime/driver/worker.js",
      "dist/console/index.html",
      ...examples.map((file) => `examples/${file}`)
    ])
  )
  const unwanted = files.filter(
    (file) =>
      /^(test|bench|src|console|docs|deploy|node_modules)\//.test(file) ||
      file.includes("fixtures") ||
      file.endsWith(".map")
  )
  expect(unwanted).toEqual([])
}

/** Names new in `dir` since `before` that name one of `pids` or `nodeId`. */
const newFilesOf = (dir: string, before: ReadonlySet<string>, pids: ReadonlySet<number>, nodeId: string) =>
  readdirSync(dir).filter(
    (name) =>
      !before.has(name) &&
      (name.includes(nodeId) || [...name.matchAll(/-(\d+)(?=-|$)/g)].some((match) => pids.has(Number(match[1]))))
  )

describe("the package npm pack makes, installed from its tarball", () => {
  let root = ""
  let project = ""
  let globalPrefix = ""
  let tarball = ""
  let registry: LockRegistry | undefined
  let projectInstall: Result
  let globalInstall: Result

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-package-"))
    trackPath(root)
    project = join(root, "project")
    globalPrefix = join(root, "global")
    await mkdir(project)
    // The build is the test run's own (npm test builds first): prepack finds it current.
    const pack = await run("npm", ["pack", "--json", "--pack-destination", root], repoRoot, npmEnv(), 120_000)
    expect(pack.code, pack.stderr).toBe(0)
    const [report] = JSON.parse(pack.stdout) as Array<{ filename: string }>
    tarball = join(root, report!.filename)
    registry = await startLockRegistry()
    const quiet = ["--no-audit", "--no-fund", ...registry.npmArgs]
    // An empty folder's first steps: a package.json (npm init), then the tarball as a dependency.
    await writeFile(join(project, "package.json"), `${JSON.stringify({ name: "cornserve-user", private: true })}\n`)
    ;[projectInstall, globalInstall] = await Promise.all([
      run("npm", ["install", ...quiet, tarball], project, npmEnv(), installLimitMs),
      run("npm", ["install", "--global", "--prefix", globalPrefix, ...quiet, tarball], root, npmEnv(), installLimitMs)
    ])
  }, 120_000 + installLimitMs)

  afterAll(async () => {
    await registry?.close()
    if (root !== "") await rm(root, { recursive: true, force: true })
  })

  it("npm pack --dry-run lists the build, the binary and the examples, and no tests, benches, sources or fixtures", async () => {
    const dryRun = await run("npm", ["pack", "--dry-run", "--json"], repoRoot)
    expect(dryRun.code, dryRun.stderr).toBe(0)
    const listed = packedFiles(dryRun.stdout)
    expectShippable(listed)
    // What was packed for real is what the dry run lists.
    const tar = await run("tar", ["-tzf", tarball], root)
    expect(
      tar.stdout
        .trim()
        .split("\n")
        .map((path) => path.replace(/^package\//, ""))
        .sort()
    ).toEqual([...listed].sort())
  })

  it(
    "npx cornserve serve --examples serves hello from the project's install, and Ctrl-C leaves nothing behind",
    async () => {
      expect(projectInstall.code, projectInstall.stderr).toBe(0)
      const stateDir = join(root, "state")
      const nodeId = `package-${process.pid}`
      const shmBefore = new Set(readdirSync("/dev/shm"))
      const tmpBefore = new Set(readdirSync(tmpdir()))
      const serve: ChildProcess = spawn(
        "npx",
        [
          "--no-install",
          "cornserve",
          "serve",
          "--examples",
          "--idle-release",
          "120",
          "--port",
          "0",
          "--state-dir",
          stateDir,
          "--node-id",
          nodeId
        ],
        {
          cwd: project,
          env: npmEnv({ CORNSERVE_MODEL_DIR: join(root, "models"), XDG_CACHE_HOME: join(root, "cache") }),
          stdio: ["ignore", "pipe", "pipe"],
          // A group of its own, as a terminal's foreground job is: Ctrl-C reaches all of it.
          detached: true
        }
      )
      trackGroup(serve)
      const group = serve.pid!
      let output = ""
      serve.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
      serve.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
      const exited = new Promise<void>((resolve) => serve.once("exit", () => resolve()))
      try {
        await eventually(
          async () => (/ready in \d/.test(output) ? true : undefined),
          readyLimitMs,
          "serve ready"
        ).catch((error: unknown) => {
          throw new Error(`${String(error)}:\n${output.slice(-8_000)}`)
        })
        const url = /serving at (https?:\/\/\S+)/.exec(output)![1]!
        const members = new Set(groupMembers(group))
        for (const file of examples) expect(output).toContain(`registered example ${file.replace(/\.ts$/, "")}`)
        // The commands it prints are the ones this user runs.
        expect(output).toContain(`npx cornserve app invoke hello --data '{"name":"Ada"}'`)

        const hello = await invoke(url, "hello", JSON.stringify({ name: "Ada" }))
        expect(hello.status).toBe(200)
        expect(await hello.json()).toEqual({ greeting: "Hello, Ada! Cornserve is serving you." })
        // The console's bundle and Swagger UI are found in the installation.
        const consolePage = await fetch(`${url}/console`)
        expect(consolePage.status).toBe(200)
        expect(await consolePage.text()).toContain("/console/assets/")
        expect((await fetch(`${url}/docs`)).status).toBe(200)

        process.kill(-group, "SIGINT")
        await exited
        const left = await eventually(async () => (groupMembers(group).length === 0 ? [] : undefined), 30_000).catch(
          () => groupMembers(group)
        )
        expect(left).toEqual([])
        expect(output).not.toMatch(/restarting/)
        expect(newFilesOf("/dev/shm", shmBefore, members, nodeId)).toEqual([])
        expect(newFilesOf(tmpdir(), tmpBefore, members, nodeId)).toEqual([])
      } finally {
        if (groupMembers(group).length > 0) process.kill(-group, "SIGKILL")
      }
    },
    readyLimitMs + 60_000
  )

  it("cornserve init writes an app that depends on cornserve by version and type-checks against the installed SDK", async () => {
    expect(projectInstall.code, projectInstall.stderr).toBe(0)
    const app = join(project, "greeter")
    const init = await run("npx", ["--no-install", "cornserve", "init", "greeter"], project)
    expect(init.code, init.stderr).toBe(0)
    const written = JSON.parse(await readFile(join(app, "package.json"), "utf8")) as Record<string, unknown>
    expect(written.dependencies).toEqual({ cornserve: `^${manifest.version}`, effect: manifest.dependencies.effect })
    expect(written.devDependencies).toEqual({
      typescript: manifest.dependencies.typescript,
      "@types/node": manifest.dependencies["@types/node"]
    })

    // Its own check (tsc, installed with cornserve in the project around it), and the platform's.
    const env = npmEnv({ XDG_CACHE_HOME: join(root, "cache") })
    const check = await run("npm", ["run", "check"], app, env)
    expect(check.code, check.stdout + check.stderr).toBe(0)
    const appCheck = await run("npx", ["--no-install", "cornserve", "app", "check", "greeter/app.ts"], project, env)
    expect(appCheck.code, appCheck.stderr).toBe(0)

    // A type error against the SDK's declarations: its check says where.
    const source = await readFile(join(app, "app.ts"), "utf8")
    await writeFile(
      join(app, "app.ts"),
      source.replace(/\(\{ greeting: `Hello, \$\{name\}!` \}\)/, "({ greeting: name.length })")
    )
    const broken = await run("npm", ["run", "check"], app, env)
    expect(broken.code).not.toBe(0)
    expect(broken.stdout).toMatch(/app\.ts\(\d+,\d+\): error TS2322/)
  }, 120_000)

  it("installed globally, the cornserve on the PATH answers --version and --help, and its init writes a version range", async () => {
    expect(globalInstall.code, globalInstall.stderr).toBe(0)
    const env = npmEnv({ PATH: `${join(globalPrefix, "bin")}${delimiter}${process.env.PATH ?? ""}` })
    const version = await run("cornserve", ["--version"], root, env)
    expect(version.code, version.stderr).toBe(0)
    expect(version.stdout.trim()).toBe(manifest.version)
    const help = await run("cornserve", ["--help"], root, env)
    expect(help.code, help.stderr).toBe(0)
    expect(help.stdout).toContain("COMMANDS")
    expect(help.stdout).toMatch(/- serve \[/)
    const init = await run("cornserve", ["init", "global-app"], root, env)
    expect(init.code, init.stderr).toBe(0)
    const written = JSON.parse(await readFile(join(root, "global-app", "package.json"), "utf8")) as {
      dependencies: Record<string, string>
    }
    expect(written.dependencies.cornserve).toBe(`^${manifest.version}`)
  })
})
