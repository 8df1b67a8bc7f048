package io.github.deltamirror.kernelreader;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class KernelReaderTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String SCHEMA =
      "{\\\"type\\\":\\\"struct\\\",\\\"fields\\\":[{\\\"name\\\":\\\"id\\\",\\\"type\\\":\\\"long\\\","
          + "\\\"nullable\\\":true,\\\"metadata\\\":{}}]}";
  private static final String METADATA =
      "{\"metaData\":{\"id\":\"t-1\",\"format\":{\"provider\":\"parquet\",\"options\":{}},"
          + "\"schemaString\":\"" + SCHEMA + "\",\"partitionColumns\":[],\"configuration\":{},"
          + "\"createdTime\":1}}";

  @TempDir Path dir;

  private JsonNode[] run(String... args) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    int code = KernelReader.run(args, new PrintStream(bytes, true, StandardCharsets.UTF_8));
    String text = bytes.toString(StandardCharsets.UTF_8).trim();
    assertFalse(text.contains("\n"), "one line of output: " + text);
    try {
      return new JsonNode[] {JSON.readTree(text), JSON.valueToTree(code)};
    } catch (IOException e) {
      throw new AssertionError("not JSON: " + text, e);
    }
  }

  private void commit(long version, String... lines) throws IOException {
    Path log = Files.createDirectories(dir.resolve("_delta_log"));
    Files.writeString(log.resolve(String.format("%020d.json", version)), String.join("\n", lines) + "\n");
  }

  @Test
  void readsAnEmptyTable() throws IOException {
    commit(0, "{\"protocol\":{\"minReaderVersion\":1,\"minWriterVersion\":2}}", METADATA);
    JsonNode[] out = run(dir.toString());
    assertEquals(0, out[1].asInt(), out[0].toString());
    assertEquals(0, out[0].get("version").asLong());
    assertEquals(1, out[0].get("protocol").get("minReaderVersion").asInt());
    assertTrue(out[0].get("protocol").get("readerFeatures").isNull());
    assertEquals(0, out[0].get("files").size());
    assertEquals(0, out[0].get("rowCount").asLong());
    assertTrue(out[0].get("schema").asText().contains("\"id\""));
  }

  @Test
  void staleHadoopChecksumIsIgnored() throws IOException {
    commit(0, "{\"protocol\":{\"minReaderVersion\":1,\"minWriterVersion\":2}}", METADATA);
    // a Hadoop .crc sidecar that does not match the commit (the log was copied by another tool)
    Files.write(
        dir.resolve("_delta_log").resolve(String.format(".%020d.json.crc", 0)),
        new byte[] {'c', 'r', 'c', 0, 0, 0, 2, 0, 1, 2, 3, 4});
    JsonNode[] out = run(dir.toString());
    assertEquals(KernelReader.OK, out[1].asInt(), out[0].toString());
  }

  @Test
  void unknownReaderFeatureIsUnsupported() throws IOException {
    commit(
        0,
        "{\"protocol\":{\"minReaderVersion\":3,\"minWriterVersion\":7,"
            + "\"readerFeatures\":[\"someFutureFeature\"],\"writerFeatures\":[\"someFutureFeature\"]}}",
        METADATA);
    JsonNode[] out = run(dir.toUri().toString());
    assertEquals(KernelReader.UNSUPPORTED, out[1].asInt(), out[0].toString());
    assertEquals("unsupported", out[0].get("kind").asText());
    assertEquals("snapshot", out[0].get("phase").asText());
    assertTrue(out[0].get("error").asText().contains("someFutureFeature"), out[0].toString());
  }

  @Test
  void notATableIsAnError() {
    JsonNode[] out = run(dir.toString());
    assertEquals(KernelReader.ERROR, out[1].asInt(), out[0].toString());
    assertEquals("error", out[0].get("kind").asText());
    assertTrue(out[0].get("error").asText().startsWith("io.delta.kernel"), out[0].toString());
  }

  @Test
  void severalVersionsInOneRun() throws IOException {
    commit(0, "{\"protocol\":{\"minReaderVersion\":1,\"minWriterVersion\":2}}", METADATA);
    commit(1, "{\"commitInfo\":{\"operation\":\"noop\"}}");
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    int code =
        KernelReader.run(
            new String[] {dir.toString(), "--versions", "0-1,5", "--no-rows"},
            new PrintStream(bytes, true, StandardCharsets.UTF_8));
    String[] lines = bytes.toString(StandardCharsets.UTF_8).trim().split("\n");
    assertEquals(KernelReader.OK, code);
    assertEquals(3, lines.length);
    assertEquals(0, JSON.readTree(lines[0]).get("version").asLong());
    assertEquals(1, JSON.readTree(lines[1]).get("version").asLong());
    JsonNode missing = JSON.readTree(lines[2]);
    assertEquals(5, missing.get("version").asLong());
    assertEquals("error", missing.get("kind").asText(), missing.toString());
    assertTrue(missing.get("rowCount") == null);
  }

  @Test
  void badArguments() {
    assertEquals(KernelReader.USAGE, run()[1].asInt());
    assertEquals(KernelReader.USAGE, run(dir.toString(), "--version", "x")[1].asInt());
    assertEquals(KernelReader.USAGE, run(dir.toString(), "--versions", "3-1")[1].asInt());
    assertEquals(KernelReader.USAGE, run(dir.toString(), "--version", "1", "--versions", "1")[1].asInt());
  }

  @Test
  void pathsAreDecodedAndRelative() {
    String root = "file:/tmp/t";
    assertEquals("a b/part-0.parquet", TableReader.relativePath("a%20b/part-0.parquet", root));
    assertEquals("x=1/p.parquet", TableReader.relativePath("x%3D1/p.parquet", root));
    assertEquals("p q.parquet", TableReader.relativePath("p q.parquet", root));
    assertEquals("d/p.parquet", TableReader.relativePath("file:///tmp/t/d/p.parquet", root));
    assertEquals("s3://other/p.parquet", TableReader.relativePath("s3://other/p.parquet", root));
  }

  @Test
  void statsRecords() {
    assertEquals(Optional.of(7L), TableReader.numRecords(Optional.of("{\"numRecords\":7}")));
    assertEquals(Optional.empty(), TableReader.numRecords(Optional.of("{}")));
    assertEquals(Optional.empty(), TableReader.numRecords(Optional.of("not json")));
    assertEquals(Optional.empty(), TableReader.numRecords(Optional.empty()));
  }
}
