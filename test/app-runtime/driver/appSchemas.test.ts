import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { defineApp } from "../../../src/app-runtime/App.js"
import { appSchemasOf, maxSchemaDefs, readAppSchemas } from "../../../src/app-runtime/driver/AppSchemas.js"

/** Schemas naming `count` schemas whose names all read as `_` in a document (one CJK character each). */
const collidingDefs = (count: number) => {
  const defs = Object.fromEntries(
    Array.from({ length: count }, (_, index) => [String.fromCharCode(0x4e00 + index), {}])
  )
  return {
    json: JSON.stringify({ request: { $ref: `#/$defs/${String.fromCharCode(0x4e00)}` }, $defs: defs }),
    streams: false
  }
}

describe("the schemas an app's process sends, as the platform reads them", () => {
  it("names as many colliding names as the bound allows apart, each reference following its own", () => {
    const read = readAppSchemas(collidingDefs(maxSchemaDefs))
    if (typeof read === "string") throw new Error(read)
    expect(read.defs.size).toBe(maxSchemaDefs)
    expect([...read.defs.keys()].slice(0, 3)).toEqual(["_", "__2", "__3"])
    expect(read.request).toEqual({ $ref: "#/$defs/_" })
  })

  it("refuses schemas naming more schemas than the bound, saying so, before any naming", () => {
    expect(readAppSchemas(collidingDefs(24_000))).toBe(
      `its schemas name 24000 schemas ($defs), over the limit of ${maxSchemaDefs}`
    )
  })

  it("an app whose schemas name more schemas than the bound sends a note instead, and still loads", () => {
    const fields = Object.fromEntries(
      Array.from({ length: maxSchemaDefs + 1 }, (_, index) => [
        `f${index}`,
        Schema.Int.annotations({ identifier: `N${index}` })
      ])
    )
    const sent = appSchemasOf(defineApp({ tasks: {}, request: Schema.Struct(fields), serve: () => ({}) }))
    const read = readAppSchemas(sent)
    if (typeof read === "string") throw new Error(read)
    expect(read.defs.size).toBe(0)
    expect((read.request as { description: string }).description).toBe(
      `The app's schemas name ${maxSchemaDefs + 1} schemas ($defs) as JSON Schema, over the limit of ${maxSchemaDefs}.`
    )
  })
})
