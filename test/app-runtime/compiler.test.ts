import { spawnSync } from "node:child_process"
import { mkdtemp, rm, symlink } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { Schema } from "effect"
import * as esbuild from "esbuild"
import { afterAll, describe, expect, it } from "vitest"
import { type AppDefinition, defineApp, isApp } from "../../src/app-runtime/App.js"
import { compileApp, stopCompiler } from "../../src/app-runtime/AppCompiler.js"
import { ChatCompletionRequest, LLMTask, MLLMTask } from "../../src/app-runtime/index.js"

// ---------------------------------------------------------------------------------------------
// 4. defineApp
// ---------------------------------------------------------------------------------------------

/** defineApp without the compiler's help, for definitions the types would refuse. */
const defineUnchecked = (definition: unknown) =>
  defineApp(definition as AppDefinition<unknown, unknown, unknown, unknown>)

const thrownBy = (f: () => unknown): Error => {
  try {
    f()
  } catch (error) {
    return error as Error
  }
  throw new Error("expected the call to throw")
}

const model = "Qwen/Qwen2.5-VL-7B-Instruct"

describe("defineApp", () => {
  it("accepts a sound definition and returns an app", () => {
    const mllm = new MLLMTask({ model, modalities: ["image"] })
    const app = defineApp({
      tasks: { mllm },
      request: ChatCompletionRequest,
      response: Schema.String,
      serve: async () => "done",
      description: "chat about images"
    })

    expect(isApp(app)).toBe(true)
    expect(app.tasks.mllm).toBe(mllm)
    expect(app.description).toBe("chat about images")
  })

  it("accepts an app that calls no tasks", () => {
    const app = defineApp({
      tasks: {},
      request: Schema.Struct({ name: Schema.String }),
      serve: ({ name }) => `hello ${name}`
    })
    expect(isApp(app)).toBe(true)
  })

  it("does not mistake other values for apps", () => {
    expect(isApp({ tasks: {}, request: Schema.String, serve: () => "x" })).toBe(false)
    expect(isApp(null)).toBe(false)
    expect(isApp("app")).toBe(false)
  })

  it("throws a TypeError naming a missing serve", () => {
    const error = thrownBy(() => defineUnchecked({ tasks: {}, request: Schema.String }))
    expect(error).toBeInstanceOf(TypeError)
    expect(error.message).toContain("`serve` must be a function")
  })

  it("throws a TypeError when request is not an Effect Schema", () => {
    const error = thrownBy(() => defineUnchecked({ tasks: {}, request: { type: "object" }, serve: () => "x" }))
    expect(error).toBeInstanceOf(TypeError)
    expect(error.message).toContain("`request` must be an Effect Schema")
  })

  it("throws a TypeError naming a task entry that is not a task", () => {
    const error = thrownBy(() =>
      defineUnchecked({
        tasks: { llm: new LLMTask({ model }), helper: { invoke: () => "not a task" } },
        request: Schema.String,
        serve: () => "x"
      })
    )
    expect(error).toBeInstanceOf(TypeError)
    expect(error.message).toContain("tasks.helper is not a task")
    expect(error.message).not.toContain("tasks.llm")
  })

  it("lists every problem at once", () => {
    const error = thrownBy(() => defineUnchecked({ tasks: { bad: 42 }, request: "string" }))
    expect(error).toBeInstanceOf(TypeError)
    expect(error.message).toContain("`serve` must be a function")
    expect(error.message).toContain("`request` must be an Effect Schema")
    expect(error.message).toContain("tasks.bad is not a task")
  })
})

// ---------------------------------------------------------------------------------------------
// 5. compileApp
// ---------------------------------------------------------------------------------------------

const scratchDirs: Array<string> = []

afterAll(async () => {
  await stopCompiler()
  for (const dir of scratchDirs) await rm(dir, { recursive: true, force: true })
})

/** Uses the SDK and a Node built-in only, so it compiles inside vitest as well as in plain Node. */
const sdkAndBuiltinApp = `import { ChatCompletionRequest, defineApp } from "cornserve/app"
import { setTimeout } from "node:timers/promises"

export default defineApp({
  tasks: {},
  request: ChatCompletionRequest,
  serve: async (request: { messages: ReadonlyArray<unknown> }) => {
    await setTimeout(1)
    return \`\${request.messages.length} messages\`
  }
})
`

/** Uses the SDK, effect and a Node built-in, like a real app. */
const validApp = `import { defineApp } from "cornserve/app"
import { Schema } from "effect"
import { setTimeout } from "node:timers/promises"

const Request = Schema.Struct({ name: Schema.String })

export default defineApp({
  tasks: {},
  request: Request,
  serve: async ({ name }: { name: string }) => {
    await setTimeout(1)
    return \`hello \${name}\`
  }
})
`

/** The specifiers of the import statements in compiled code. */
const importedSpecifiers = (code: string): Array<string> =>
  [...code.matchAll(/^import\s[^;]*?from\s*"([^"]+)"/gm)].map((match) => match[1]!)

type CompileResult = Awaited<ReturnType<typeof compileApp>>

/**
 * Runs compileApp in a plain Node process, as the platform does. The compiler resolves "effect"
 * with import.meta.resolve, which vitest 3's module runner does not provide
 * (vitest-dev/vitest#6953), so that path cannot run inside the test process.
 */
const compileInNode = async (source: string, fileName: string): Promise<CompileResult> => {
  const dir = await mkdtemp(join(tmpdir(), "cornserve-compiler-"))
  scratchDirs.push(dir)
  // The compiled compiler sits next to the project's node_modules, so "effect" resolves as in the project.
  await symlink(fileURLToPath(new URL("../../node_modules", import.meta.url)), join(dir, "node_modules"), "dir")
  const compiler = join(dir, "AppCompiler.mjs")
  await esbuild.build({
    entryPoints: [fileURLToPath(new URL("../../src/app-runtime/AppCompiler.ts", import.meta.url))],
    outfile: compiler,
    format: "esm",
    platform: "node",
    logLevel: "silent"
  })
  const script = `
    import { compileApp, stopCompiler } from ${JSON.stringify(pathToFileURL(compiler).href)}
    const [source, fileName] = JSON.parse(process.argv[1])
    process.stdout.write(JSON.stringify(await compileApp(source, fileName)))
    await stopCompiler()
  `
  const child = spawnSync(process.execPath, ["--input-type=module", "-e", script, JSON.stringify([source, fileName])], {
    encoding: "utf8"
  })
  if (child.status !== 0) throw new Error(`the compiler process failed: ${child.stderr}`)
  return JSON.parse(child.stdout) as CompileResult
}

describe("compileApp", () => {
  it("compiles an app that imports the SDK, effect and a Node built-in", async () => {
    const result = await compileInNode(validApp, "hello.ts")

    expect(result._tag).toBe("Compiled")
    if (result._tag !== "Compiled") return
    const specifiers = importedSpecifiers(result.code)
    expect(specifiers).toHaveLength(3)
    expect(specifiers).toContain("node:timers/promises")
    expect(result.code).not.toContain('"cornserve/app"')
    expect(result.code).not.toContain('"effect"')
    // The SDK and effect are imported by absolute file: URLs to the platform's own copies.
    const sdk = specifiers.find((specifier) => specifier.endsWith("/index.js") && !specifier.includes("node_modules"))
    expect(sdk).toMatch(/^file:\/\/\//)
    const effect = specifiers.find((specifier) => specifier.includes("/node_modules/effect/"))
    expect(effect).toMatch(/^file:\/\/\//)
    // TypeScript annotations are gone.
    expect(result.code).not.toContain(": { name: string }")
  })

  it("imports the SDK by an absolute file: URL to the platform's app-runtime", async () => {
    const result = await compileApp(sdkAndBuiltinApp, "hello.ts")

    expect(result._tag).toBe("Compiled")
    if (result._tag !== "Compiled") return
    const [sdk, timers] = importedSpecifiers(result.code)
    expect(new URL(sdk!).protocol).toBe("file:")
    expect(sdk).toBe(new URL("../../src/app-runtime/index.js", import.meta.url).href)
    expect(timers).toBe("node:timers/promises")
  })

  it("gives Node built-ins named without the node: prefix their node: name", async () => {
    const source = `import { readFileSync } from "fs"\nexport const read = () => readFileSync("x")\n`
    const result = await compileApp(source, "fs-app.ts")

    expect(result._tag).toBe("Compiled")
    if (result._tag !== "Compiled") return
    expect(importedSpecifiers(result.code)).toEqual(["node:fs"])
  })

  it("reports a syntax error with file:line:column", async () => {
    const source = [
      'import { defineApp } from "cornserve/app"', // line 1
      "", // line 2
      "const total = (1 + );" // line 3: the ")" is at column 20
    ].join("\n")

    const result = await compileApp(source, "broken.ts")

    expect(result._tag).toBe("SyntaxError")
    if (result._tag !== "SyntaxError") return
    expect(result.message).toMatch(/^broken\.ts:3:20: /)
  })

  it("refuses a used import of a package other than the SDK and effect", async () => {
    const source = `import { defineApp } from "cornserve/app"
import { Schema } from "effect"
import _ from "lodash"

export default defineApp({
  tasks: {},
  request: Schema.String,
  serve: (text: string) => _.capitalize(text)
})
`
    const result = await compileApp(source, "lodash-app.ts")

    expect(result._tag).toBe("ForbiddenImport")
    if (result._tag !== "ForbiddenImport") return
    expect(result.module).toBe("lodash")
    expect(result.message).toContain('"lodash"')
    expect(result.message).toContain("lodash-app.ts:3:")
  })

  it("refuses a relative import", async () => {
    const source = `import { helper } from "./other"\nexport const run = () => helper()\n`
    const result = await compileApp(source, "relative.ts")

    expect(result._tag).toBe("ForbiddenImport")
    if (result._tag !== "ForbiddenImport") return
    expect(result.module).toBe("./other")
    expect(result.message).toContain('"./other"')
  })

  it("compiles again after the compiler was stopped", async () => {
    await stopCompiler()
    const result = await compileApp(sdkAndBuiltinApp, "hello.ts")
    expect(result._tag).toBe("Compiled")
  })
})
