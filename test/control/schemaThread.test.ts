import { describe, expect, it } from "vitest"
import { type AppSchemas, readAppSchemas } from "../../src/app-runtime/driver/AppSchemas.js"
import { appSchemasOf, cleanedSchemasOf, SchemaThread } from "../../src/control/SchemaThread.js"

const standIn = new URL("../fixtures/schema-thread/standInWorker.mjs", import.meta.url)
const auth = { adminToken: true, metricsToken: true }
const app = (schemas = { json: "{}", streams: false }, registeredAt = "then") => ({
  id: "a",
  description: undefined,
  example: undefined,
  schemas,
  needsApiKey: false,
  registeredAt
})

describe("the schemas an app sent, as text between threads", () => {
  it("come back as the documents take them, a key __proto__ a key still, the named schemas in their order", () => {
    const read = readAppSchemas({
      json: JSON.stringify({
        request: { properties: { ["__proto__"]: { $ref: "#/$defs/2" } } },
        response: { type: "string" },
        $defs: { b: {}, "2": { type: "integer" } }
      }),
      streams: true
    }) as AppSchemas
    const back = appSchemasOf(cleanedSchemasOf(read))
    expect(back).toEqual({ ...read, defs: read.defs })
    expect(Object.keys((back.request as { properties: object }).properties)).toEqual(["__proto__"])
    expect([...back.defs.keys()]).toEqual([...read.defs.keys()])
  })
})

describe("SchemaThread", () => {
  it("answers reads, and writes a document again only when what it shows changed", async () => {
    const thread = new SchemaThread(standIn)
    try {
      expect(await thread.read({ json: "{}", streams: false })).toEqual({ json: "{}", streams: false })
      expect(await thread.read({ json: "refuse", streams: false })).toBe("no")
      const schemas = { json: "{}", streams: false }
      const first = await thread.platformDocument([app(schemas)], auth)
      expect(await thread.platformDocument([app(schemas)], auth)).toBe(first)
      expect(await thread.platformDocument([app({ ...schemas })], auth)).not.toBe(first)
      expect(await thread.platformDocument([app(schemas, "now")], auth)).not.toBe(first)
      expect(await thread.platformDocument([app(schemas)], { ...auth, adminToken: false })).not.toBe(first)
      expect(await thread.appDocument(app(schemas))).toContain("appDocument")
    } finally {
      await thread.close()
    }
  })

  it("fails the jobs of a thread that stops, and starts another for the next", async () => {
    const thread = new SchemaThread(standIn)
    try {
      await expect(thread.read({ json: "exit", streams: false })).rejects.toThrow("exit code 3")
      expect(await thread.read({ json: "{}", streams: false })).toEqual({ json: "{}", streams: false })
    } finally {
      await thread.close()
    }
    await expect(thread.read({ json: "{}", streams: false })).rejects.toThrow("stopped")
  })
})
