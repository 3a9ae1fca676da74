import { readdirSync, readFileSync } from "node:fs"
import { join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"

const root = fileURLToPath(new URL("../../", import.meta.url))
const src = join(root, "src")

const sourceFiles = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return sourceFiles(path)
    return /\.m?ts$/.test(entry.name) ? [path] : []
  })

/** `class X extends Schema.TaggedError<X>()("Tag", …)` and `Data.TaggedError("Tag")`, across line breaks. */
const declaration = /class\s+(\w+)\s+extends\s+(?:Schema\.TaggedError<\w+>\(\)|Data\.TaggedError)\(\s*"([^"]+)"/g

/** Every tagged error class declared under src/: its tag, its class and where it is. */
const declarations = sourceFiles(src).flatMap((file) =>
  [...readFileSync(file, "utf8").matchAll(declaration)].map(([, className, tag]) => ({
    tag: tag!,
    where: `${relative(root, file)}: ${className}`
  }))
)

describe("tagged errors", () => {
  it("finds the platform's error classes", () => {
    const tags = new Set(declarations.map((entry) => entry.tag))
    for (const tag of ["InternalError", "SidecarInternalError", "AppNotFound", "EngineUnavailable", "MediaError"])
      expect(tags).toContain(tag)
  })

  it("names each tag by one class only, so that a decoded error is the class its sender meant", () => {
    const byTag = new Map<string, Array<string>>()
    for (const { tag, where } of declarations) byTag.set(tag, [...(byTag.get(tag) ?? []), where])
    const shared = [...byTag].filter(([, classes]) => classes.length > 1)
    expect(shared).toEqual([])
  })
})
