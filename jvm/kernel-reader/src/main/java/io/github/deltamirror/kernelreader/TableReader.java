package io.github.deltamirror.kernelreader;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.delta.kernel.Scan;
import io.delta.kernel.Snapshot;
import io.delta.kernel.SnapshotBuilder;
import io.delta.kernel.TableManager;
import io.delta.kernel.data.ColumnVector;
import io.delta.kernel.data.ColumnarBatch;
import io.delta.kernel.data.FilteredColumnarBatch;
import io.delta.kernel.data.Row;
import io.delta.kernel.engine.Engine;
import io.delta.kernel.engine.FileReadResult;
import io.delta.kernel.internal.InternalScanFileUtils;
import io.delta.kernel.internal.actions.AddFile;
import io.delta.kernel.internal.actions.DeletionVectorDescriptor;
import io.delta.kernel.internal.actions.Metadata;
import io.delta.kernel.internal.actions.Protocol;
import io.delta.kernel.internal.data.ScanStateRow;
import io.delta.kernel.internal.util.Utils;
import io.delta.kernel.types.StructType;
import io.delta.kernel.utils.CloseableIterator;
import io.delta.kernel.utils.FileStatus;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeSet;

/**
 * One snapshot of a Delta table as delta-kernel-java sees it: version, schema, protocol, partition
 * columns, the data files of its scan, their statistics and (optionally) the rows actually read.
 *
 * <p>Everything goes through the kernel's public scan API, so a feature the kernel does not
 * implement fails here as it would for Trino or Flink.
 */
final class TableReader {
  private static final ObjectMapper JSON = new ObjectMapper();

  private final Engine engine;
  /** What {@link #read} was doing: "snapshot" (the log), "scan" (the file list), "data" (rows). */
  private String phase = "snapshot";

  TableReader(Engine engine) {
    this.engine = engine;
  }

  String phase() {
    return phase;
  }

  /** The JSON-ready view of {@code table} at {@code version} (latest when null). */
  Map<String, Object> read(String table, Long version, boolean readRows) throws IOException {
    phase = "snapshot";
    SnapshotBuilder builder = TableManager.loadSnapshot(table);
    if (version != null) {
      builder = builder.atVersion(version);
    }
    Snapshot snapshot = builder.build(engine);
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("version", snapshot.getVersion());
    StructType schema = snapshot.getSchema();
    out.put("schema", schema.toJson());
    Metadata metadata = snapshot.getMetadata();
    out.put("schemaString", metadata.getSchemaString());
    out.put("tableId", metadata.getId());
    out.put("protocol", protocol(snapshot.getProtocol()));
    out.put("partitionColumns", snapshot.getPartitionColumnNames());
    out.put("configuration", new java.util.TreeMap<>(metadata.getConfiguration()));

    phase = "scan";
    Scan scan = snapshot.getScanBuilder().build();
    Row scanState = scan.getScanState(engine);
    String root = ScanStateRow.getTableRoot(scanState).toString();
    List<Row> scanFiles = new ArrayList<>();
    try (CloseableIterator<FilteredColumnarBatch> batches = scan.getScanFiles(engine, true)) {
      while (batches.hasNext()) {
        try (CloseableIterator<Row> rows = batches.next().getRows()) {
          while (rows.hasNext()) {
            scanFiles.add(rows.next());
          }
        }
      }
    }
    TreeSet<String> files = new TreeSet<>();
    long numRecords = 0;
    long deleted = 0;
    int withStats = 0;
    int withDv = 0;
    for (Row scanFile : scanFiles) {
      Row add = scanFile.getStruct(InternalScanFileUtils.ADD_FILE_ORDINAL);
      AddFile addFile = new AddFile(add);
      files.add(relativePath(addFile.getPath(), root));
      Optional<Long> records = numRecords(addFile.getStatsJson());
      if (records.isPresent()) {
        numRecords += records.get();
        withStats++;
      }
      DeletionVectorDescriptor dv = InternalScanFileUtils.getDeletionVectorDescriptorFromRow(scanFile);
      if (dv != null) {
        deleted += dv.getCardinality();
        withDv++;
      }
    }
    out.put("files", new ArrayList<>(files));
    out.put("numFiles", scanFiles.size());
    // physical records per stats (null unless every file has them), and rows hidden by DVs
    out.put("numRecords", withStats == scanFiles.size() ? numRecords : null);
    out.put("numRecordsPartial", withStats == scanFiles.size() ? null : numRecords);
    out.put("filesWithStats", withStats);
    out.put("filesWithDeletionVectors", withDv);
    out.put("deletedRecords", deleted);
    phase = "data";
    out.put("rowCount", readRows ? countRows(scanState, scanFiles) : null);
    return out;
  }

  private static Map<String, Object> protocol(Protocol protocol) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("minReaderVersion", protocol.getMinReaderVersion());
    out.put("minWriterVersion", protocol.getMinWriterVersion());
    // the kernel keeps features as sets: null when the protocol version has no feature lists
    out.put(
        "readerFeatures",
        protocol.supportsReaderFeatures() ? new TreeSet<>(protocol.getReaderFeatures()) : null);
    out.put(
        "writerFeatures",
        protocol.supportsWriterFeatures() ? new TreeSet<>(protocol.getWriterFeatures()) : null);
    return out;
  }

  /** {@code numRecords} of an {@code add.stats} JSON string, if it has one. */
  static Optional<Long> numRecords(Optional<String> stats) {
    if (stats.isEmpty() || stats.get().isBlank()) {
      return Optional.empty();
    }
    try {
      JsonNode node = JSON.readTree(stats.get()).get("numRecords");
      return node != null && node.canConvertToLong() ? Optional.of(node.asLong()) : Optional.empty();
    } catch (IOException e) {
      return Optional.empty(); // unparsable stats are no stats, as for every reader
    }
  }

  /**
   * {@code add.path} as a path below the table root: a relative path is a URI reference, so its
   * escapes are decoded; an absolute URI under the root is made relative, any other stays whole.
   */
  static String relativePath(String addPath, String tableRoot) {
    URI uri;
    try {
      uri = new URI(addPath);
    } catch (URISyntaxException e) {
      return addPath; // not escaped (some writers do that): it is already the plain path
    }
    if (!uri.isAbsolute()) {
      return uri.getPath() != null ? uri.getPath() : addPath;
    }
    String decoded = uri.getScheme() + ":" + uri.getSchemeSpecificPart();
    for (String root : roots(tableRoot)) {
      if (decoded.startsWith(root)) {
        return decoded.substring(root.length());
      }
    }
    return decoded;
  }

  /** The spellings of a table root an absolute {@code add.path} may start with. */
  private static List<String> roots(String tableRoot) {
    List<String> out = new ArrayList<>();
    String root = tableRoot.endsWith("/") ? tableRoot : tableRoot + "/";
    try {
      URI uri = new URI(root);
      root = uri.getScheme() + ":" + uri.getSchemeSpecificPart();
    } catch (URISyntaxException e) {
      // keep it as it is
    }
    out.add(root);
    if (root.startsWith("file:///")) {
      out.add("file:/" + root.substring("file:///".length()));
    } else if (root.startsWith("file:/")) {
      out.add("file://" + root.substring("file:".length()));
    }
    return out;
  }

  /** Rows the kernel returns for the whole snapshot (deletion vectors applied). */
  private long countRows(Row scanState, List<Row> scanFiles) throws IOException {
    StructType physical = ScanStateRow.getPhysicalDataReadSchema(scanState);
    long count = 0;
    for (Row scanFile : scanFiles) {
      FileStatus status = InternalScanFileUtils.getAddFileStatus(scanFile);
      CloseableIterator<ColumnarBatch> data =
          engine
              .getParquetHandler()
              .readParquetFiles(
                  Utils.singletonCloseableIterator(status), physical, Optional.empty())
              .map(FileReadResult::getData);
      try (CloseableIterator<FilteredColumnarBatch> logical =
          Scan.transformPhysicalData(engine, scanState, scanFile, data)) {
        while (logical.hasNext()) {
          count += selected(logical.next());
        }
      }
    }
    return count;
  }

  private static long selected(FilteredColumnarBatch batch) {
    Optional<ColumnVector> selection = batch.getSelectionVector();
    int size = batch.getData().getSize();
    if (selection.isEmpty()) {
      return size;
    }
    ColumnVector vector = selection.get();
    long n = 0;
    for (int i = 0; i < size; i++) {
      if (!vector.isNullAt(i) && vector.getBoolean(i)) {
        n++;
      }
    }
    return n;
  }
}
