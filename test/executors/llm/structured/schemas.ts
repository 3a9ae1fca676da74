import type { ResponseFormat } from "../../../../src/executors/llm/structured/GrammarNodes.js"

/** Response formats of every shape the grammar supports, each with the schema an independent validator checks. */
export interface Case {
  readonly name: string
  readonly format: ResponseFormat
  /** What the output must validate against (the schema itself, or "any object" for json_object). */
  readonly validate: unknown
}

const strict = (name: string, schema: Record<string, unknown>): Case => ({
  name,
  format: { type: "json_schema", json_schema: { name, schema, strict: true } },
  validate: schema
})

const loose = (name: string, schema: Record<string, unknown>): Case => ({
  name,
  format: { type: "json_schema", json_schema: { name, schema } },
  validate: schema
})

export const cases: ReadonlyArray<Case> = [
  strict("person", {
    type: "object",
    properties: {
      name: { type: "string", description: "full name" },
      age: { type: "integer" },
      email: { type: ["string", "null"] }
    },
    required: ["name", "age", "email"],
    additionalProperties: false
  }),
  strict("nested", {
    type: "object",
    properties: {
      user: {
        type: "object",
        properties: {
          id: { type: "integer" },
          profile: {
            type: "object",
            properties: { bio: { type: "string" }, score: { type: "number" } },
            required: ["bio", "score"],
            additionalProperties: false
          }
        },
        required: ["id", "profile"],
        additionalProperties: false
      },
      flags: { type: "array", items: { type: "boolean" }, minItems: 1, maxItems: 3 }
    },
    required: ["user", "flags"],
    additionalProperties: false
  }),
  strict("enums", {
    type: "object",
    properties: {
      status: { type: "string", enum: ["active", "inactive", "pending"] },
      version: { const: 2 },
      mixed: { enum: ["a", 1, 12, 1.5, null, true, { k: [1] }] }
    },
    required: ["status", "version", "mixed"],
    additionalProperties: false
  }),
  strict("shapes (anyOf with a shared prefix)", {
    type: "object",
    properties: {
      shapes: {
        type: "array",
        maxItems: 4,
        items: {
          anyOf: [
            {
              type: "object",
              properties: { kind: { const: "circle" }, radius: { type: "number" } },
              required: ["kind", "radius"],
              additionalProperties: false
            },
            {
              type: "object",
              properties: { kind: { const: "square" }, side: { type: "number" } },
              required: ["kind", "side"],
              additionalProperties: false
            },
            {
              type: "object",
              properties: { kind: { const: "circle" }, label: { type: "string" } },
              required: ["kind", "label"],
              additionalProperties: false
            }
          ]
        }
      }
    },
    required: ["shapes"],
    additionalProperties: false
  }),
  strict("tree ($defs recursion)", {
    type: "object",
    properties: { root: { $ref: "#/$defs/node" } },
    required: ["root"],
    additionalProperties: false,
    $defs: {
      node: {
        type: "object",
        properties: {
          name: { type: "string" },
          children: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 }
        },
        required: ["name", "children"],
        additionalProperties: false
      }
    }
  }),
  strict("linked list (recursion through #)", {
    type: "object",
    properties: { value: { type: "integer" }, next: { anyOf: [{ $ref: "#" }, { type: "null" }] } },
    required: ["value", "next"],
    additionalProperties: false
  }),
  loose("definitions (draft-07)", {
    type: "object",
    properties: { a: { $ref: "#/definitions/point" }, b: { $ref: "#/definitions/point" } },
    required: ["a", "b"],
    definitions: {
      point: {
        type: "object",
        properties: { x: { type: "number" }, y: { type: "number" } },
        required: ["x", "y"]
      }
    }
  }),
  strict("numbers", {
    type: "object",
    properties: {
      x: { type: "number" },
      n: { type: "integer" },
      list: { type: "array", items: { type: "number" }, minItems: 2, maxItems: 5 }
    },
    required: ["x", "n", "list"],
    additionalProperties: false
  }),
  loose("optional properties", {
    type: "object",
    properties: {
      a: { type: "string" },
      b: { type: "integer" },
      c: { type: "boolean" },
      d: { type: "array", items: { type: "string" } }
    },
    required: ["b"]
  }),
  loose("array at the root", { type: "array", items: { type: ["number", "string"] }, minItems: 2, maxItems: 4 }),
  loose("free object values", {
    type: "object",
    properties: { meta: { type: "object", additionalProperties: { type: "integer" } } },
    required: ["meta"]
  }),
  { name: "json_object", format: { type: "json_object" }, validate: { type: "object" } }
]
