/*
 * caprl's long-lived SPICE process: the official SPICE 1.0 scorer (edu.anu.spice, the
 * spice-1.0.jar pycocoevalcap ships) with its Stanford CoreNLP pipeline loaded once.
 *
 * Run as a single source file (Java 11+, no javac step):
 *   java -Xmx8G -cp spice-1.0.jar:lib/*:stanford-corenlp-3.6.0.jar:stanford-corenlp-3.6.0-models.jar \
 *        SpiceServer.java [-threads N] [-noSynsets] [-subset] [-cacheSize N]
 *
 * Protocol (UTF-8 lines): the server prints "ready" once its parser is built; then, for each
 * request line "<input.json>\t<output.json>" on stdin it scores the input file (SPICE's own
 * format: [{"image_id": .., "test": "caption", "refs": ["ref", ...]}, ...]), writes SPICE's
 * per-image JSON ([{"image_id": .., "scores": {"All": {"f": .., "pr": .., "re": .., ...}, ...}}])
 * to the output file and answers "ok <count>", or "error <message>" if that request failed.
 * "quit" or end of input stops it. Everything else the scorer prints goes to stderr.
 *
 * Differences from `java -jar spice-1.0.jar in.json -out out.json -subset`, none of which
 * changes a score: the CoreNLP pipeline and the caption parses are kept in memory between
 * requests (a bounded LRU map instead of SPICE's LMDB cache, whose serialisation fails on
 * Java 16+), the output JSON is written without the Nashorn pretty-printer (gone since
 * Java 15), and System.exit calls from inside SPICE are refused (an error answer instead).
 */

import edu.anu.spice.SceneGraph;
import edu.anu.spice.SpiceParser;
import edu.anu.spice.SpiceStats;
import edu.anu.spice.TupleFilter;

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.Reader;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;

import org.json.simple.JSONArray;
import org.json.simple.JSONObject;
import org.json.simple.parser.JSONParser;

public class SpiceServer {

    public static void main(String[] args) throws Exception {
        PrintStream protocol = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        System.setOut(System.err);  // only protocol lines go to stdout
        int threads = Runtime.getRuntime().availableProcessors();
        int cacheSize = 200000;
        boolean synsets = true;
        boolean subset = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "-threads": threads = Integer.parseInt(args[++i]); break;
                case "-cacheSize": cacheSize = Integer.parseInt(args[++i]); break;
                case "-noSynsets": synsets = false; break;
                case "-subset": subset = true; break;
                default:
                    protocol.println("error unknown option " + args[i]);
                    Runtime.getRuntime().halt(2);
            }
        }
        guardExit();
        CachingParser parser;
        try {
            parser = new CachingParser(threads, synsets, cacheSize);
        } catch (Throwable ex) {  // e.g. NoClassDefFoundError: the CoreNLP jars are not on the class path
            ex.printStackTrace();
            protocol.println("error could not start SPICE: " + oneLine(ex));
            Runtime.getRuntime().halt(1);
            return;
        }
        Map<String, TupleFilter> filters = subset ? subsetFilters() : new HashMap<String, TupleFilter>();
        protocol.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) {
                continue;
            }
            if (line.equals("quit")) {
                break;
            }
            String[] paths = line.split("\t");
            try {
                if (paths.length != 2) {
                    throw new IllegalArgumentException("expected '<input.json>\\t<output.json>', got " + line);
                }
                int count = score(parser, filters, synsets, Paths.get(paths[0]), Paths.get(paths[1]));
                protocol.println("ok " + count);
            } catch (Exception ex) {
                ex.printStackTrace();
                protocol.println("error " + oneLine(ex));
            }
        }
        protocol.flush();
        Runtime.getRuntime().halt(0);  // CoreNLP's worker threads would keep a plain exit waiting
    }

    /** Score one SPICE input file, exactly as SpiceScorer.scoreBatch does; returns the item count. */
    static int score(CachingParser parser, Map<String, TupleFilter> filters, boolean synsets,
                     Path inPath, Path outPath) throws Exception {
        JSONArray input;
        try (Reader reader = Files.newBufferedReader(inPath, StandardCharsets.UTF_8)) {
            input = (JSONArray) new JSONParser().parse(reader);
        }
        List<Object> imageIds = new ArrayList<Object>();
        List<String> testCaptions = new ArrayList<String>();
        List<String> refCaptions = new ArrayList<String>();
        List<Integer> refChunks = new ArrayList<Integer>();
        for (Object o : input) {
            JSONObject item = (JSONObject) o;
            imageIds.add(item.get("image_id"));
            testCaptions.add((String) item.get("test"));
            JSONArray refs = (JSONArray) item.get("refs");
            refChunks.add(refs.size());
            for (Object ref : refs) {
                refCaptions.add((String) ref);
            }
        }
        List<SceneGraph> refSgs = parser.parseCaptions(refCaptions, refChunks);
        List<SceneGraph> testSgs = parser.parseCaptions(testCaptions);
        SpiceStats stats = new SpiceStats(filters, false);
        for (int i = 0; i < testSgs.size(); ++i) {
            stats.score(imageIds.get(i), testSgs.get(i), refSgs.get(i), synsets);
        }
        Path partial = outPath.resolveSibling(outPath.getFileName() + ".partial");
        try (Writer writer = Files.newBufferedWriter(partial, StandardCharsets.UTF_8)) {
            writer.write(stats.toJSONString());
        }
        Files.move(partial, outPath, StandardCopyOption.REPLACE_EXISTING);
        return testSgs.size();
    }

    static Map<String, TupleFilter> subsetFilters() {
        Map<String, TupleFilter> filters = new HashMap<String, TupleFilter>();
        filters.put("Object", TupleFilter.objectFilter);
        filters.put("Attribute", TupleFilter.attributeFilter);
        filters.put("Relation", TupleFilter.relationFilter);
        filters.put("Cardinality", TupleFilter.cardinalityFilter);
        filters.put("Color", TupleFilter.colorFilter);
        filters.put("Size", TupleFilter.sizeFilter);
        return filters;
    }

    static String oneLine(Throwable ex) {
        String text = ex.toString();
        return text.replace('\n', ' ').replace('\r', ' ');
    }

    /** An attempt of SPICE's code to end the process, turned into an exception. */
    static final class ExitRefused extends SecurityException {
        private static final long serialVersionUID = 1L;

        ExitRefused(int status) {
            super("SPICE called System.exit(" + status + ")");
        }
    }

    /** Refuse System.exit (Java 18+ needs -Djava.security.manager=allow; without it, no guard). */
    @SuppressWarnings("removal")
    static void guardExit() {
        try {
            System.setSecurityManager(new SecurityManager() {
                @Override
                public void checkExit(int status) {
                    throw new ExitRefused(status);
                }

                @Override
                public void checkPermission(java.security.Permission perm) {
                }

                @Override
                public void checkPermission(java.security.Permission perm, Object context) {
                }
            });
        } catch (UnsupportedOperationException | SecurityException ex) {
            System.err.println("SpiceServer: System.exit guard not installed (" + ex + ")");
        }
    }

    /** SPICE's parser with caption parses kept in a bounded in-memory LRU map. */
    static final class CachingParser extends SpiceParser {
        private final Map<String, ArrayList<ArrayList<String>>> cache;

        CachingParser(int threads, boolean synsets, int capacity) {
            super(null, threads, synsets);
            this.cache = new LinkedHashMap<String, ArrayList<ArrayList<String>>>(1024, 0.75f, true) {
                @Override
                protected boolean removeEldestEntry(Map.Entry<String, ArrayList<ArrayList<String>>> eldest) {
                    return size() > capacity;
                }
            };
        }

        @Override
        protected Map<String, ArrayList<ArrayList<String>>> loadTuples(List<String> input) {
            Map<String, ArrayList<ArrayList<String>>> out = new HashMap<String, ArrayList<ArrayList<String>>>();
            LinkedHashSet<String> unseen = new LinkedHashSet<String>();
            for (String caption : input) {
                ArrayList<ArrayList<String>> tuples = cache.get(caption);
                if (tuples != null) {
                    out.put(caption, tuples);
                } else {
                    unseen.add(caption);
                }
            }
            if (!unseen.isEmpty()) {
                Map<String, ArrayList<ArrayList<String>>> fresh = generateTuples(new ArrayList<String>(unseen));
                out.putAll(fresh);
                cache.putAll(fresh);
            }
            return out;
        }
    }
}
