import * as Schema from "effect/Schema"

/**
 * OpenAI's image generation (`POST /v1/images/generations`): the request an app takes and the
 * answer it gives. An app whose request is `ImageGenerationRequest` is an images app: the gateway
 * checks the request's parameters and writes the app's `ImagesResponse` as OpenAI's clients read it.
 */

const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

/** "WIDTHxHEIGHT", 8 to 4096 pixels a side, or "auto" (the model's own size). */
export const ImageSize = Schema.Union(
  Schema.Literal("auto"),
  Schema.TemplateLiteral(Schema.Number, "x", Schema.Number).pipe(
    Schema.filter((size) => {
      const [width, height] = size.split("x").map(Number)
      return [width, height].every((side) => Number.isInteger(side) && side! >= 8 && side! <= 4096)
        ? true
        : "must be WIDTHxHEIGHT with whole sides of 8 to 4096 pixels, or auto"
    })
  )
)

export const ImageGenerationRequest = Schema.Struct({
  /** What to paint. */
  prompt: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(32_000)),
  /** The model asked for; an app answers with the model its task serves. */
  model: optionalNullable(Schema.String),
  /** Images to paint, 1 to 10 (default 1). */
  n: optionalNullable(Schema.Int.pipe(Schema.between(1, 10))),
  size: optionalNullable(ImageSize),
  /** Only b64_json: the platform keeps no files to link to. */
  response_format: optionalNullable(Schema.Literal("b64_json")),
  /** Only png. */
  output_format: optionalNullable(Schema.Literal("png")),
  /** The noise a generator that starts from noise draws: the same seed paints the same image. */
  seed: optionalNullable(Schema.Int),
  /** Who asked (OpenAI's end-user id); kept in the app's logs only if the app logs it. */
  user: optionalNullable(Schema.String.pipe(Schema.maxLength(256)))
}).annotations({ identifier: "ImageGenerationRequest" })
export type ImageGenerationRequest = typeof ImageGenerationRequest.Type

/** OpenAI's answer: the images as base64 PNGs. */
export const ImagesResponse = Schema.Struct({
  created: Schema.Int,
  data: Schema.Array(
    Schema.Struct({
      b64_json: Schema.String,
      revised_prompt: Schema.optional(Schema.String)
    })
  ),
  output_format: Schema.optional(Schema.Literal("png")),
  size: Schema.optional(Schema.String)
}).annotations({ identifier: "ImagesResponse" })
export type ImagesResponse = typeof ImagesResponse.Type

/** The width and height a request's `size` names; undefined for "auto" or none. */
export const imageSizeOf = (
  size: ImageGenerationRequest["size"]
): { readonly width: number; readonly height: number } | undefined => {
  if (size == null || size === "auto") return undefined
  const [width, height] = size.split("x").map(Number) as [number, number]
  return { width, height }
}
